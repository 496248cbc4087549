package gatewaysel

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// storeCtx bounds one store call.
func (s *Table) storeCtx(cfg *Config) (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, cfg.StoreTimeout)
}

// storeUsable reports whether the store is configured and not resting
// after an error.
func (s *Table) storeUsable(cfg *Config) bool {
	if cfg.Store == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.now().Before(s.storeDownUntil)
}

// storeDone records the outcome of op, which on success touched the keys
// touched: an error rests the store for StoreRetry (the replica goes on
// locally) and is reported, the first one on some keys also as StoreDown;
// a success clears the troubles of the keys it touched (and of KeysAny:
// the store answers), each reported as StoreUp, and when none is left it
// ends the rest (a call made while the store rested: reconcile's). So a
// store that refuses only the locks stays down for them however often
// values answer, and each transition is reported once.
func (s *Table) storeDone(cfg *Config, location, op string, touched StoreKeys, err error) {
	if s.ctx.Err() != nil {
		return // shutting down: not the store's fault
	}
	s.mu.Lock()
	var events []StoreEvent
	if err != nil {
		t := asTrouble(op, err)
		events = append(events, StoreEvent{Kind: StoreError, Location: location, Err: err, Trouble: t})
		if _, ok := s.troubles[t.Keys]; !ok {
			s.troubles[t.Keys] = StoreTroubleState{Keys: t.Keys, Op: t.Op, Reason: t.Reason, Err: t.Err.Error(), Since: s.now()}
			events = append(events, StoreEvent{Kind: StoreDown, Location: location, Err: err, Trouble: t})
		}
		s.storeDownUntil = s.now().Add(cfg.StoreRetry)
	} else {
		for k, st := range s.troubles {
			if k&^touched == 0 {
				delete(s.troubles, k)
				events = append(events, StoreEvent{Kind: StoreUp, Location: location, Trouble: &StoreTrouble{Op: op, Keys: k, Reason: st.Reason}})
			}
		}
		if len(s.troubles) == 0 {
			s.storeDownUntil = time.Time{}
		}
	}
	s.storeDown = len(s.troubles) > 0
	s.mu.Unlock()
	s.report(cfg, events...)
}

func (s *Table) report(cfg *Config, events ...StoreEvent) {
	if cfg.OnStore == nil {
		return
	}
	for _, ev := range events {
		cfg.OnStore(ev)
	}
}

// StoreHealthy reports whether the store has no keys in trouble (true
// before the first call); false without a store.
func (s *Table) StoreHealthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Store != nil && !s.storeDown
}

// lockTTL is how long a probe lock lives: the run's deadline and the two
// store calls that bracket it; the holder extends it while its run goes
// (keepLock), so a late run does not lose it.
func lockTTL(cfg *Config) time.Duration { return cfg.Deadline + 2*cfg.StoreTimeout }

// maxHold bounds how long a holder keeps extending its lock (a run whose
// probes overrun their deadline), and so how long another replica waits.
func maxHold(cfg *Config) time.Duration { return 2*cfg.Deadline + lockTTL(cfg) }

// claim is a probe lock this replica holds, or may hold, for a run.
type claim struct {
	token string
	skip  []byte // the unusable value the lock was taken over
	// unconfirmed: the GetOrLock that would have taken the lock failed,
	// yet Redis may have run it after this replica stopped waiting (a
	// paused or slow Redis runs what waited in its socket once it goes
	// on), so the lock may be held under token, with no one to extend or
	// release it. The result is published under token all the same
	// (publish, reconcile): written over such a lock, which it releases,
	// rather than left pending until the lock expires (lockTTL, 7.5 s by
	// default) while the other replicas answer their own results.
	unconfirmed bool
}

// held reports whether c is a lock this replica knows it took.
func (c *claim) held() bool { return c != nil && !c.unconfirmed }

// fetchOrRun is the flight of a location with no fresh local entry when a
// store is configured. In one atomic step (GetOrLock) it gets the stored
// value, or takes the location's probe lock: a fresh value answers; with
// the lock this replica probes and publishes (see run); when another
// replica holds the lock, it asks again every StorePoll (queries wait on the
// flight up to the answer deadline, as for a local run, and then fall back)
// until that replica's result is there or its lock is gone (it died: then
// this one takes it). A value that does not validate here is skipped: the
// next step locks over it, unless it changed meanwhile. On a store error, or
// after waiting maxHold, it probes locally.
func (s *Table) fetchOrRun(location string, e *entry, done chan struct{}, cfg Config, epoch uint64) {
	defer s.wg.Done()
	if !s.storeUsable(&cfg) {
		s.run(location, e, done, cfg, epoch, nil)
		return
	}
	token := newToken()
	giveUp := time.Now().Add(maxHold(&cfg))
	var skip []byte
	waited, counted := false, false
	for {
		ctx, cancel := s.storeCtx(&cfg)
		c, err := cfg.Store.GetOrLock(ctx, location, token, lockTTL(&cfg), skip)
		cancel()
		touched := KeysBoth
		if c.Value != nil {
			touched = KeysValue
		}
		s.storeDone(&cfg, location, "get_or_lock", touched, err)
		if err != nil {
			s.run(location, e, done, cfg, epoch, &claim{token: token, skip: skip, unconfirmed: true})
			return
		}
		if c.Malformed != nil && !counted {
			counted = true
			s.report(&cfg, StoreEvent{Kind: StoreMalformed, Location: location, Err: c.Malformed})
		}
		if c.Value != nil {
			if res := s.decode(location, c.Value, &cfg, &counted); res != nil && s.adopt(e, done, res, epoch) {
				return
			}
			if !slices.Equal(skip, c.Value) {
				skip = c.Value // lock over it at once, unless it changes again
				continue
			}
		} else if c.Locked {
			s.run(location, e, done, cfg, epoch, &claim{token: token, skip: skip})
			return
		} else if !waited {
			waited = true
			s.report(&cfg, StoreEvent{Kind: StoreLockWait, Location: location})
		}
		if time.Now().After(giveUp) {
			break // the holder should have written or let go by now
		}
		if !sleep(s.ctx, cfg.StorePoll) {
			s.abandon(e, done)
			return
		}
	}
	s.run(location, e, done, cfg, epoch, nil)
}

// decode validates a stored value for cfg: a fresh result, or nil (an
// invalid or stale value is reported once per flight, *counted).
func (s *Table) decode(location string, data []byte, cfg *Config, counted *bool) *gatewayorder.Result {
	res, err := decodeStored(data, cfg, s.now())
	switch {
	case err == nil && s.now().Sub(res.At) < cfg.CacheTTL:
		return res
	case err == nil, *counted: // expired here (a shorter cache_ttl), or reported already
	case errors.Is(err, errStale):
		*counted = true
		s.report(cfg, StoreEvent{Kind: StoreStale, Location: location, Err: err})
	default:
		*counted = true
		s.report(cfg, StoreEvent{Kind: StoreMalformed, Location: location, Err: err})
	}
	return nil
}

// adopt installs a result read from the store as e's, ending the flight
// done; it reports false when a reload invalidated the measurements since
// the flight began (the flight then goes on).
func (s *Table) adopt(e *entry, done chan struct{}, res *gatewayorder.Result, epoch uint64) bool {
	s.mu.Lock()
	if epoch != s.epoch {
		s.mu.Unlock()
		return false
	}
	if !sameGateways(res.Gateways, s.cfg.Gateways) {
		if res = s.remap(res); res == nil {
			s.mu.Unlock()
			return false
		}
	}
	e.res, e.epoch, e.failed, e.fromReplica, e.pending = res, epoch, nil, true, false
	e.flight, e.progress = nil, nil
	s.adoptHold(e, res, s.now())
	s.mu.Unlock()
	close(done)
	s.requestSave()
	return true
}

// abandon ends a flight without a result (the selector is closing).
func (s *Table) abandon(e *entry, done chan struct{}) {
	s.mu.Lock()
	e.flight, e.progress = nil, nil
	s.mu.Unlock()
	close(done)
}

// keepLock extends c's lock every third of its lifetime until stop closes
// or maxHold has passed.
func (s *Table) keepLock(location string, c *claim, cfg Config, stop chan struct{}) {
	defer s.wg.Done()
	ttl := lockTTL(&cfg)
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	until := time.Now().Add(maxHold(&cfg))
	for {
		select {
		case <-stop:
			return
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		if time.Now().After(until) {
			return
		}
		ctx, cancel := s.storeCtx(&cfg)
		held, err := cfg.Store.Extend(ctx, location, c.token, ttl)
		cancel()
		s.storeDone(&cfg, location, "extend", KeysLock, err)
		if err == nil && !held {
			return // lost (it expired during a stall): Publish will tell
		}
	}
}

// outcome is what publishing a run's result left the location with.
type outcome struct {
	res         *gatewayorder.Result // what the location answers: the run's, or the stored one
	fromReplica bool                 // res is the stored value of another replica's run
	pending     bool                 // the run's result is not the stored one yet (reconcile)
	token       string               // with pending: the run's lock token, which reconcile publishes under
}

// publish writes a run's result for the other replicas (Publish) and
// releases c's lock: when the run lost the race (its lock expired and
// another replica wrote, or holds the lock), the stored value comes back
// and is answered instead; with nothing usable stored yet, the run's result
// answers and stays pending, for reconcile. Without a lock held (c nil: a
// run after a long wait; unconfirmed: after a store error) it writes only
// where nothing is stored and no one holds the lock but, maybe, c's token;
// and it leaves a resting store alone unless try is set (reconcile).
func (s *Table) publish(location string, res *gatewayorder.Result, cfg Config, c *claim, try bool) outcome {
	out := outcome{res: res}
	if c != nil {
		out.token = c.token
	}
	if res == nil || cfg.Store == nil || (!c.held() && !try && !s.storeUsable(&cfg)) {
		if c.held() {
			s.unlock(location, cfg, c)
		}
		out.pending = res != nil && cfg.Store != nil
		return out
	}
	ttl := cfg.CacheTTL - s.now().Sub(res.At)
	data, err := encodeStored(res, &cfg)
	if ttl < time.Millisecond || err != nil {
		if c.held() {
			s.unlock(location, cfg, c)
		}
		return outcome{res: res}
	}
	token, skip := "", []byte(nil)
	if c != nil {
		token, skip = c.token, c.skip
	}
	ctx, cancel := s.storeCtx(&cfg)
	stored, written, err := cfg.Store.Publish(ctx, location, token, data, ttl, skip)
	cancel()
	s.storeDone(&cfg, location, "publish", KeysBoth, err)
	switch {
	case err != nil:
		if c.held() {
			s.unlock(location, cfg, c)
		}
		out.pending = true
	case written, bytes.Equal(stored, data): // (the second: this replica's own, taken back after a store lost its data)
	case stored != nil:
		counted := false
		if r := s.decode(location, stored, &cfg, &counted); r != nil {
			s.report(&cfg, StoreEvent{Kind: StoreAdopted, Location: location})
			return outcome{res: r, fromReplica: true}
		}
		out.pending = !counted // a value this replica cannot use: keep its own
	default:
		out.pending = true // another replica holds the lock: its result comes later
	}
	return out
}

func (s *Table) unlock(location string, cfg Config, c *claim) {
	ctx, cancel := s.storeCtx(&cfg)
	err := cfg.Store.Unlock(ctx, location, c.token)
	cancel()
	s.storeDone(&cfg, location, "unlock", KeysLock, err)
}

// reconcile takes up to reconcileBatch fresh results that are not the
// stored one (pending: probed while the store was down, or by a run that
// lost the race) to the store, each under its run's lock token: written
// where nothing is stored and no one holds the lock but, maybe, that token
// (a get-or-lock that Redis ran after this replica gave up on it: see
// claim.unconfirmed), else the stored value replaces it. It runs on the
// re-check timer (recheck.go), and its first call goes even while the
// store rests after an error (the timer paces it; a failure stops the
// step), so each replica takes its results to a store that answers again
// at its next tick, not a rest later. A replica that found another's lock
// there reads that one's result at the tick after: replicas that answered
// different results converge on the stored one within two intervals and a
// store timeout (a tick's call begun before the store answered) of it
// answering.
func (s *Table) reconcile() {
	cfg := s.Config()
	if cfg.Store == nil {
		return
	}
	if !s.checkGeneration(&cfg) {
		return
	}
	now := s.now()
	type item struct {
		loc   string
		e     *entry
		res   *gatewayorder.Result
		token string
	}
	var items []item
	s.mu.Lock()
	for loc, e := range s.entries {
		if e.pending && e.flight == nil && s.fresh(e, now) {
			items = append(items, item{loc, e, e.res, e.token})
			if len(items) == reconcileBatch {
				break
			}
		}
	}
	epoch := s.epoch
	s.mu.Unlock()
	tried := false
	for _, it := range items {
		if tried && !s.storeUsable(&cfg) {
			return
		}
		res := it.res
		if !sameGateways(res.Gateways, cfg.Gateways) {
			continue // measured under an older configuration: leave it
		}
		var c *claim
		if it.token != "" {
			c = &claim{token: it.token, unconfirmed: true}
		}
		out := s.publish(it.loc, res, cfg, c, !tried)
		tried = true
		s.mu.Lock()
		if it.e.res == res && s.epoch == epoch {
			it.e.pending = out.pending
			if out.fromReplica {
				it.e.res, it.e.fromReplica = out.res, true
				s.adoptHold(it.e, out.res, now)
			}
		}
		s.mu.Unlock()
		if out.fromReplica {
			s.requestSave()
		}
	}
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
