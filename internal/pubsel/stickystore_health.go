package pubsel

import (
	"context"
	"time"
)

// answered notes that a call got an answer: the run of calls without one
// ends. One atomic load while there is none.
func (s *StickyStore) answered() {
	if s.failing.Load() == 0 {
		return
	}
	s.mu.Lock()
	s.streak = 0
	s.failing.Store(0)
	s.mu.Unlock()
}

// fail counts a failed call on key and records it. An error reply (the
// store answered) marks the store refusing keys; a call without an answer
// extends the run of such calls, and the store is marked unreachable once
// the run is DownFailures long and spans DownAfter. Every transition is
// decided under one lock, so it happens once, and reported in order.
func (s *StickyStore) fail(key string, err error) {
	s.stats.Errors.Add(1)
	reason, answered := Trouble(err)
	s.stats.countReason(reason)
	now := time.Now()
	s.eventMu.Lock()
	defer s.eventMu.Unlock()
	s.mu.Lock()
	s.lastError, s.lastReason, s.errorAt = err.Error(), reason, now
	down, refusing, recheck, watch := false, false, false, false
	if answered {
		s.streak = 0
		s.failing.Store(0)
		s.refusedAt, s.refusedKey, s.refusedReason = now, key, reason
		if !s.refusing {
			s.refusing, s.refusingSince, refusing = true, now, true
			if !s.watching {
				s.watching, watch = true, true
			}
		}
	} else {
		if s.streak == 0 {
			s.streakSince = now
		}
		s.streak++
		s.failing.Store(int32(min(s.streak, 1<<30)))
		if s.streak >= s.cfg.DownFailures && now.Sub(s.streakSince) >= s.cfg.DownAfter &&
			s.healthy.CompareAndSwap(true, false) {
			s.downSince, down = now, true
			if !s.rechecking {
				s.rechecking, recheck = true, true
			}
		}
	}
	s.mu.Unlock()
	if down && testHookFailDecided != nil {
		testHookFailDecided()
	}
	if down && s.cfg.OnHealth != nil {
		s.cfg.OnHealth(false, err)
	}
	if refusing && s.cfg.OnRefusal != nil {
		s.cfg.OnRefusal(true, reason, key, err)
	}
	if recheck {
		go s.recheck()
	}
	if watch {
		go s.watchRefusal()
	}
}

// testHookFailDecided, if set (tests), runs in fail once its lock is
// released, when it decided to mark the store down: a test widens there
// the window in which a transition decided outside one lock would be
// decided twice.
var testHookFailDecided func()

// recheck pings the store every Recheck until it answers (or the StickyStore is
// replaced), then marks it healthy.
func (s *StickyStore) recheck() {
	t := time.NewTicker(s.cfg.Recheck)
	defer t.Stop()
	for range t.C {
		if s.closed.Load() {
			s.mu.Lock()
			s.rechecking = false
			s.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.backgroundTimeout())
		err := s.cfg.Store.Ping(ctx)
		cancel()
		if err == nil {
			s.eventMu.Lock()
			s.mu.Lock()
			s.rechecking = false
			s.streak = 0
			s.failing.Store(0)
			s.healthy.Store(true)
			s.mu.Unlock()
			if s.cfg.OnHealth != nil {
				s.cfg.OnHealth(true, nil)
			}
			s.eventMu.Unlock()
			return
		}
		reason, _ := Trouble(err)
		s.stats.countReason(reason)
		s.mu.Lock()
		s.lastError, s.lastReason, s.errorAt = err.Error(), reason, time.Now()
		s.mu.Unlock()
	}
}

// watchRefusal ends the refusing state once no key was refused for
// RefusalHold.
func (s *StickyStore) watchRefusal() {
	t := time.NewTicker(min(s.cfg.Recheck, s.cfg.RefusalHold))
	defer t.Stop()
	for range t.C {
		s.eventMu.Lock()
		s.mu.Lock()
		closed := s.closed.Load()
		ended := !closed && time.Since(s.refusedAt) >= s.cfg.RefusalHold
		if closed || ended {
			s.watching = false
		}
		if ended {
			s.refusing = false
		}
		s.mu.Unlock()
		if ended && s.cfg.OnRefusal != nil {
			s.cfg.OnRefusal(false, "", "", nil)
		}
		s.eventMu.Unlock()
		if closed || ended {
			return
		}
	}
}
