package diambind

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// run is the writer: it sends the queue to the store in batches when
// woken, and while the store is down pings it every Recheck; when it
// answers again, the queue (what was decided meanwhile) is written.
func (s *Shared) run() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Load().Recheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
		}
		if !s.health.Healthy() && !s.recheck() {
			continue
		}
		s.flush()
	}
}

// recheck pings a down store; true once it answers (logged once).
func (s *Shared) recheck() bool {
	cfg := s.cfg.Load()
	ctx, cancel := context.WithTimeout(s.ctx, s.background())
	err := cfg.Store.Ping(ctx)
	cancel()
	if err != nil {
		s.health.Note(err, time.Now())
		return false
	}
	down, _ := s.health.Back(time.Now())
	s.mu.Lock()
	queued := len(s.queue)
	s.mu.Unlock()
	s.log.Info("binding store back: writing the bindings made and ended meanwhile",
		"store", cfg.Name, "down_for", down.Round(time.Millisecond).String(), "queued", queued)
	return true
}

// flush writes the queue, a batch at a time, until it is empty or the
// store fails a call (what failed waits for the next wake or tick).
func (s *Shared) flush() {
	for s.health.Healthy() && s.ctx.Err() == nil {
		cfg := s.cfg.Load()
		sids, items := s.take()
		if len(items) == 0 {
			return
		}
		ops := make([]Op, len(items))
		for i, q := range items {
			ops[i] = q.op
			ops[i].Key = Key(cfg.Prefix, []byte(sids[i]))
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.background())
		res := cfg.Store.Apply(ctx, ops, time.Duration(s.ttl.Load()))
		cancel()
		failed := false
		for i := range items {
			var err error = &Trouble{Reason: "other", Err: errors.New("no result")}
			if i < len(res) {
				err = res[i].Err
			}
			if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNotFound) {
				failed = true
				s.requeue(sids[i], items[i])
				s.fail(err)
				continue
			}
			s.answered()
			s.settle(sids[i], items[i], res[i], cfg)
		}
		s.mu.Lock()
		s.sending = 0
		s.mu.Unlock()
		if failed {
			return
		}
	}
}

// take removes up to a batch of writes from the queue.
func (s *Shared) take() ([]string, []queued) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(s.queue), batch)
	sids, items := make([]string, 0, n), make([]queued, 0, n)
	for sid, q := range s.queue {
		if len(items) == n {
			break
		}
		sids, items = append(sids, sid), append(items, q)
		delete(s.queue, sid)
	}
	s.sending = n
	return sids, items
}

// requeue puts back a write the store did not take, unless a newer one
// for the session was queued meanwhile.
func (s *Shared) requeue(sid string, q queued) {
	q.deferred = true
	s.mu.Lock()
	if _, newer := s.queue[sid]; !newer {
		s.queue[sid] = q
	}
	s.mu.Unlock()
}

// settle counts a write the store answered. A Claim that found another
// server's identity lost to the replica that wrote first: the agent
// adopts it, or, when it cannot (a value that is no server of its table),
// overwrites it with its own.
func (s *Shared) settle(sid string, q queued, r Result, cfg *Config) {
	if q.deferred {
		s.stats.reconciled.Add(1)
	}
	switch q.op.Kind {
	case End:
		s.stats.ended.Add(1)
		return
	case Move:
		s.stats.written.Add(1)
		return
	}
	if r.Err == nil && r.Value == q.op.Value {
		s.stats.written.Add(1)
		return
	}
	if r.Err == nil && wellFormed(r.Value) && s.adopt != nil && s.adopt(sid, r.Value) {
		s.stats.adopted.Add(1)
		return
	}
	s.stats.malformed.Add(1)
	q.op.Kind = Move
	s.requeue(sid, q)
}

// background bounds a call made off the request's path.
func (s *Shared) background() time.Duration {
	return max(s.cfg.Load().Timeout, 250*time.Millisecond)
}

// answered notes that a call got an answer: the run of calls without one
// ends (storefault.Health: one atomic load while there is none).
func (s *Shared) answered() { s.health.Answered() }

// fail counts a failed call. storefault.Health's rule decides: an error
// reply (the store answered) never marks it down; the store is marked down
// once DownFailures calls in a row went without an answer over DownAfter
// (one slow answer on a busy host is not a down store), once, so it is
// logged once.
func (s *Shared) fail(err error) {
	s.stats.errors.Add(1)
	cfg := s.cfg.Load()
	reason, down := s.health.Fail(err, time.Now(), cfg.DownFailures, cfg.DownAfter)
	if down {
		s.mu.Lock()
		queued := len(s.queue)
		s.mu.Unlock()
		s.log.Warn("binding store down: bindings stay local; new and ended ones are queued and written when it answers",
			"store", cfg.Name, "reason", reason, "error", err.Error(), "queued", queued)
	}
}

// stats are the shared level's counts, kept across reloads.
type stats struct {
	lookups, found, notFound, malformed, skipped atomic.Int64
	errors, written, ended, adopted, reconciled  atomic.Int64
	dropped                                      atomic.Int64
}

// View is the shared level's state for the admin view.
type View struct {
	Store     string    `json:"store"`
	Prefix    string    `json:"prefix"`
	Healthy   bool      `json:"healthy"`
	DownSince time.Time `json:"down_since,omitzero"`
	// Queued are the writes waiting for the store, those being sent
	// included; Backlog bounds those waiting.
	Queued     int       `json:"queued"`
	Backlog    int       `json:"backlog"`
	LastError  string    `json:"last_error,omitempty"`
	LastReason string    `json:"last_reason,omitempty"`
	ErrorAt    time.Time `json:"error_at,omitzero"`
	Counts     Counts    `json:"counts"`
}

// Counts are the shared level's counters since the agent was made.
type Counts struct {
	Lookups    int64 `json:"lookups"`    // local misses of continuing requests
	Found      int64 `json:"found"`      // answered by the store
	NotFound   int64 `json:"not_found"`  // the store had none
	Malformed  int64 `json:"malformed"`  // a value that names no server here
	Skipped    int64 `json:"skipped"`    // not asked: the store was down
	Errors     int64 `json:"errors"`     // calls that failed or timed out
	Written    int64 `json:"written"`    // bindings written or renewed
	Ended      int64 `json:"ended"`      // bindings deleted
	Adopted    int64 `json:"adopted"`    // another replica's binding taken
	Reconciled int64 `json:"reconciled"` // writes made after waiting through store trouble
	Dropped    int64 `json:"dropped"`    // writes not queued: the backlog was full
	Downs      int64 `json:"downs"`      // times the store was marked down
}

// View returns the shared level's state now.
func (s *Shared) View() View {
	cfg := s.cfg.Load()
	h := s.health.View()
	s.mu.Lock()
	v := View{Store: cfg.Name, Prefix: cfg.Prefix, Healthy: h.Healthy, DownSince: h.DownSince, Queued: len(s.queue) + s.sending,
		Backlog: cfg.Backlog, LastError: h.LastError, LastReason: h.LastReason, ErrorAt: h.ErrorAt}
	s.mu.Unlock()
	c := &s.stats
	v.Counts = Counts{Lookups: c.lookups.Load(), Found: c.found.Load(), NotFound: c.notFound.Load(),
		Malformed: c.malformed.Load(), Skipped: c.skipped.Load(), Errors: c.errors.Load(), Written: c.written.Load(),
		Ended: c.ended.Load(), Adopted: c.adopted.Load(), Reconciled: c.reconciled.Load(), Dropped: c.dropped.Load(),
		Downs: h.Downs}
	return v
}
