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
		s.spawn(s.recheck)
	}
	if watch {
		s.spawn(s.watchRefusal)
	}
}

// testHookFailDecided, if set (tests), runs in fail once its lock is
// released, when it decided to mark the store down: a test widens there
// the window in which a transition decided outside one lock would be
// decided twice.
var testHookFailDecided func()

// recheck pings the store every Recheck until it answers (or the StickyStore is
// closed), then marks it healthy.
func (s *StickyStore) recheck() {
	t := time.NewTicker(s.cfg.Recheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.backgroundTimeout())
		err := s.cfg.Store.Ping(ctx)
		cancel()
		if s.ctx.Err() != nil {
			return // closed meanwhile: the ping's error is ours
		}
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
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.eventMu.Lock()
		s.mu.Lock()
		ended := time.Since(s.refusedAt) >= s.cfg.RefusalHold
		if ended {
			s.watching, s.refusing = false, false
		}
		s.mu.Unlock()
		if ended && s.cfg.OnRefusal != nil {
			s.cfg.OnRefusal(false, "", "", nil)
		}
		s.eventMu.Unlock()
		if ended {
			return
		}
	}
}

// backgroundTimeout bounds a call made off the request's path.
func (s *StickyStore) backgroundTimeout() time.Duration {
	return max(s.cfg.Timeout, 250*time.Millisecond)
}

// inBackground runs call off the request's path with the pair's store key
// and TTL, bounded by backgroundTimeout and by close; at most maxRefreshes
// run at once, and a call beyond that is skipped and counted (as is one
// after close).
func (s *StickyStore) inBackground(user, app string, call func(ctx context.Context, key string, ttl time.Duration)) {
	if s.inflight.Add(1) > maxRefreshes {
		s.inflight.Add(-1)
		s.stats.Skipped.Add(1)
		return
	}
	started := s.spawn(func() {
		defer s.inflight.Add(-1)
		ctx, cancel := context.WithTimeout(s.ctx, s.backgroundTimeout())
		defer cancel()
		call(ctx, s.Key(user, app), time.Duration(s.ttl.Load()))
	})
	if !started {
		s.inflight.Add(-1)
		s.stats.Skipped.Add(1)
	}
}

// spawn runs f in a goroutine that close waits for, unless close has
// begun (false).
func (s *StickyStore) spawn(f func()) bool {
	s.goMu.RLock()
	defer s.goMu.RUnlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// close ends the store's goroutines and waits for them: a config that no
// longer uses this store (a reload, the last generation's Cleanup) leaves
// nothing running that calls it or its callbacks. Requests of the old
// generation that still pick through it call the store on their path only;
// nothing starts in the background any more.
func (s *StickyStore) close() {
	s.goMu.Lock()
	already := s.closed
	s.closed = true
	s.goMu.Unlock()
	if already {
		return
	}
	s.cancel()
	s.wg.Wait()
}
