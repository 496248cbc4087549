package pubsel

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/sticky"
)

// Host is what a Selector needs to know of a framework's upstream type U.
type Host[U comparable] interface {
	// Addr is the host:port to probe, or "" for an upstream that cannot be
	// probed (e.g. a placeholder); such an upstream stays unmeasured.
	Addr(U) string
	// Available reports the framework's own view: health checks, limits.
	Available(U) bool
	// Conns is the upstream's current connection or request count; it is
	// used only by the least-connections mode and may return 0 otherwise.
	Conns(U) int
}

// Selector picks an upstream from a pool. Views of a pool, its upstreams
// grouped by bucket, are precomputed when the pool or any publisher's
// bucket or activity changes, so a pick is a random index and a few atomic
// loads.
type Selector[U comparable] struct {
	Tracker *Tracker
	// Holder, if set, registers the pool's upstreams with the tracker, so
	// they are released with it; else they are registered for good.
	Holder *Holder
	Host   Host[U]
	Within Within // the pick inside the lowest bucket; default random
	// Choices is how many distinct random members within p2c compares:
	// 0 or 2 is two (the power of two choices), ChoicesAll every member.
	Choices int
	Sticky  *sticky.Table // nil: no stickiness
	// StickyStore, with Sticky, is the cluster's second level (State.StickyStore):
	// read on a local miss, written on a new pick. nil: local only.
	StickyStore *StickyStore
	// IntN, if set, replaces rand.IntN for the random draws inside a
	// bucket (tests make them deterministic).
	IntN func(n int) int
	// SlowStart, if positive, gives a publisher that (re)enters the lowest
	// bucket a share of new picks rising linearly from 0 to its full share
	// over this long (see temper).
	SlowStart time.Duration
	// Picks, if set, counts every decision (it may be shared with the
	// selectors of other config generations).
	Picks *Picks

	view atomic.Pointer[view[U]]
}

// Decision says how an upstream was chosen.
type Decision struct {
	Status    *Status // the chosen publisher's status; nil if it is not probed
	Sticky    bool    // an existing (user, app) entry decided
	FromStore bool    // that entry came from the shared store (a local miss)
}

// Select picks an upstream for the (user, app) pair at now (unix ns): the
// pair's sticky publisher if it is still active and available, else a
// random (or least-loaded) available member of the lowest bucket that has
// one. While no member of the pool is measured, it picks among all
// available members and pins nothing. It returns ok false when no upstream
// is available.
func (s *Selector[U]) Select(pool []U, user, app string, now int64) (u U, d Decision, ok bool) {
	u, d, ok = s.sel(pool, user, app, now, s.Sticky != nil)
	if ok && s.Picks != nil {
		s.Picks.Count(d.Status, d.Sticky)
	}
	return u, d, ok
}

// SelectUnpinned picks as Select does for a request that has no (user,
// app) pair: it neither follows nor makes a pin.
func (s *Selector[U]) SelectUnpinned(pool []U, now int64) (u U, d Decision, ok bool) {
	u, d, ok = s.sel(pool, "", "", now, false)
	if ok && s.Picks != nil {
		s.Picks.Count(d.Status, d.Sticky)
	}
	return u, d, ok
}

// sel is the NPA rule: a pinned pair is kept on its publisher while that
// stays usable (pin.go), its pin read from the local table and, on a local
// miss, from the shared store; any other pick is new, in the lowest bucket
// that has an available member, by the within policy, and a pinned pair is
// then pinned to it.
func (s *Selector[U]) sel(pool []U, user, app string, now int64, pinned bool) (u U, d Decision, ok bool) {
	if len(pool) == 0 {
		return u, d, false
	}
	v := s.currentView(pool, now)
	var p *pair
	if pinned {
		key := s.Sticky.Key(user, app)
		val, hit := s.Sticky.Get(key, now)
		if m := v.pinned(val, hit); m != nil {
			if st := s.Tracker.StatusOf(m.id); v.keeps(st) && s.Host.Available(m.u) {
				if s.StickyStore != nil {
					s.renew(key, user, app, val, st.Addr, now)
				}
				return m.u, Decision{Status: st, Sticky: true}, true
			}
		}
		p = &pair{user: user, app: app, key: key, shared: s.StickyStore != nil && !v.fallback}
		if m, st, ok := s.storedPin(v, p, now); ok {
			return m.u, Decision{Status: st, Sticky: true, FromStore: true}, true
		}
	}
	m := s.pickNew(v, p, now)
	if m == nil {
		return u, d, false
	}
	if m.probed {
		d.Status = s.statusOf(m)
		// A pick made before anything in the pool was measured is not
		// latency-based: do not pin the pair to it.
		if p != nil && !v.fallback && (d.Status.Measured || s.Tracker.cfg.Load().NoBuckets) {
			m, d.Status = s.pin(v, p, m, d.Status, now)
		}
	}
	return m.u, d, true
}

// pickNew is a new pick for the pair p (nil: none): in the lowest bucket
// that has an available member, by the within policy, then slow start.
func (s *Selector[U]) pickNew(v *view[U], p *pair, now int64) *member[U] {
	for _, g := range v.groups {
		m := s.pick(g, p, now)
		if m == nil {
			continue
		}
		if m.warmSince != 0 {
			m = s.temper(g, m, now)
		}
		return m
	}
	return nil
}

// statusOf is m's status, read from its target as the view was built
// (one load less) if it has one.
func (s *Selector[U]) statusOf(m *member[U]) *Status {
	if m.tg != nil {
		return m.tg.status.Load()
	}
	return s.Tracker.StatusOf(m.id)
}

func (s *Selector[U]) intN(n int) int {
	if s.IntN != nil {
		return s.IntN(n)
	}
	return rand.IntN(n)
}

// pick is the within policy's pick among the available members of g, for
// the pair p (nil: none): random, least_conn or p2c; random for a pair
// with a shared level is the pair's rendezvous pick.
func (s *Selector[U]) pick(g []member[U], p *pair, now int64) *member[U] {
	switch {
	case s.Within == WithinP2C:
		return s.pickP2C(g, now)
	case s.Within == WithinLeastConn:
		return s.pickLeastConn(g)
	case s.Within == WithinRandom && p != nil && p.shared:
		return s.pickFor(g, p.skey)
	}
	return s.pickRandom(g)
}

// pickRandom takes the first available member from a random start.
func (s *Selector[U]) pickRandom(g []member[U]) *member[U] {
	n := len(g)
	start := 0
	if n > 1 {
		start = s.intN(n)
	}
	for i := range n {
		if m := &g[(start+i)%n]; s.Host.Available(m.u) {
			return m
		}
	}
	return nil
}

func (s *Selector[U]) pickLeastConn(g []member[U]) *member[U] {
	n := len(g)
	start := 0
	if n > 1 {
		start = s.intN(n)
	}
	best, bestConns := -1, 0
	for i := range n {
		j := (start + i) % n // random start breaks ties at random
		if !s.Host.Available(g[j].u) {
			continue
		}
		if c := s.Host.Conns(g[j].u); best < 0 || c < bestConns {
			best, bestConns = j, c
		}
	}
	if best < 0 {
		return nil
	}
	return &g[best]
}

// pickFor is the pick of a pinned pair with a shared level (store key
// skey): the available member of g with the highest rendezvous score for
// the pair, a hash of the pair and the member's address. Pairs spread over
// the bucket as evenly as at random, and every replica that sees the same
// bucket makes the same pick, so a pick made when the store gave no
// answer (a slow store on a busy host, or one down) agrees with the pin
// another replica wrote for the pair all the same.
func (s *Selector[U]) pickFor(g []member[U], skey string) *member[U] {
	h := fnv64(skey)
	best, bestScore := -1, uint64(0)
	for i, m := range g {
		if !s.Host.Available(m.u) {
			continue
		}
		if sc := mix64(h ^ m.score); best < 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	if best < 0 {
		return nil
	}
	return &g[best]
}

// fnv64 is FNV-1a: stable across processes (unlike maphash), so replicas
// agree on scores.
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is SplitMix64's finalizer: every bit of the pair's and the
// member's hashes moves the score.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// StickyCounts returns how many live sticky entries point at each target id.
func (s *Selector[U]) StickyCounts(now int64) map[uint32]int {
	if s.Sticky == nil {
		return nil
	}
	return s.Sticky.Counts(now)
}
