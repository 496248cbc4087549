package gatewaysel

import "context"

// GenerationStore is a ResultStore that can tell when it lost what it
// held: a store restarted empty (or flushed) has lost the stored results
// that every replica answers from memory, and no replica's result is
// pending then, so reconcile alone would never take any back (one
// replica answers the result it had stored, another the one it probed
// since and wrote to the empty store).
type GenerationStore interface {
	// Generation returns the store's generation marker, in one atomic
	// step writing token as the marker when there is none (created). An
	// error is trouble of KeysGeneration (or KeysAny).
	Generation(ctx context.Context, token string) (gen string, created bool, err error)
}

// checkGeneration is reconcile's first step on a GenerationStore: it
// reads the generation marker (writing a new one where there is none)
// and, when the store lost its data since this replica last looked (the
// marker is new, or another than the one it saw), makes every fresh
// result here pending, with no lock token: reconcile then takes each to
// the store (written where nothing is stored and no one holds the lock,
// else the stored value replaces it), reconcileBatch a tick. It reports
// whether the store answered (a failure ends the tick, as reconcile's own
// calls do).
func (s *Table) checkGeneration(cfg *Config) bool {
	g, ok := cfg.Store.(GenerationStore)
	if !ok {
		return true
	}
	ctx, cancel := s.storeCtx(cfg)
	gen, created, err := g.Generation(ctx, newToken())
	cancel()
	s.storeDone(cfg, "", "generation", KeysGeneration, err)
	if err != nil {
		return false
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := created || (s.storeGen != "" && gen != s.storeGen)
	s.storeGen = gen
	if !lost {
		return true
	}
	for _, e := range s.entries {
		if e.flight == nil && !e.pending && s.fresh(e, now) {
			e.pending, e.token = true, ""
		}
	}
	return true
}
