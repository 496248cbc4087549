package pubsel

import (
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edgesteer/edgesteer/internal/latency"
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
	Within Within        // the pick inside the lowest bucket; default random
	Sticky *sticky.Table // nil: no stickiness
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

	view atomic.Pointer[view[U]]
}

// Decision says how an upstream was chosen.
type Decision struct {
	Status    *Status // the chosen publisher's status; nil if it is not probed
	Sticky    bool    // an existing (user, app) entry decided
	FromStore bool    // that entry came from the shared store (a local miss)
}

type view[U comparable] struct {
	gen uint64
	// fallback: no member is measured, so the pick is the configured
	// fallback over every member (random or least_conn, Caddy's own view
	// of availability deciding) and is not pinned.
	fallback bool
	first    *U // identity of the pool the view was built from
	size     int
	groups   [][]member[U] // active members by bucket, lowest bucket first
	// movePins: pinned pairs also leave a publisher that is out of the
	// lowest bucket (latency traffic or both); lowest is that bucket.
	movePins bool
	lowest   int
	byID     []int32          // target id → index in members, -1 if absent
	byAddr   map[string]int32 // probe address → index in members (shared store values)
	members  []member[U]
}

type member[U comparable] struct {
	u      U
	id     uint32
	probed bool
	score  uint64  // hash of the probe address, for pairScore (with a shared level)
	tg     *target // its target, for p2c's load figures; nil if not probed
	// warmSince: when it (re)entered the lowest bucket, if it is in slow
	// start (unix ns); 0 if not.
	warmSince int64
}

func (s *Selector[U]) currentView(pool []U, now int64) *view[U] {
	gen := s.Tracker.Generation()
	v := s.view.Load()
	if v != nil && v.gen == gen && v.size == len(pool) && v.first == unsafe.SliceData(pool) {
		return v
	}
	prev := v
	v = s.build(pool)
	if s.SlowStart > 0 {
		s.warmup(v, prev, now)
	}
	s.publishWarmup(v)
	s.view.Store(v)
	return v
}

func (s *Selector[U]) build(pool []U) *view[U] {
	// Register first: Ensure may bump the generation, and the view must
	// carry the generation its statuses were read at or after.
	ensure := s.Tracker.Ensure
	if s.Holder != nil {
		ensure = s.Holder.Ensure
	}
	ids := make([]int64, len(pool))
	for i, u := range pool {
		ids[i] = -1
		if addr := s.Host.Addr(u); addr != "" {
			if id, err := ensure(addr); err == nil {
				ids[i] = int64(id)
			}
		}
	}
	v := &view[U]{gen: s.Tracker.Generation(), first: unsafe.SliceData(pool), size: len(pool), fallback: true}
	cfg := s.Tracker.cfg.Load()
	noBuckets := cfg.NoBuckets
	v.movePins = cfg.Source != FromProbe && !noBuckets
	type ranked struct {
		m      member[U]
		bucket int
	}
	var active []ranked
	maxID := -1
	for i, u := range pool {
		m := member[U]{u: u}
		bucket := latency.Unmeasured
		if ids[i] >= 0 {
			m.id, m.probed = uint32(ids[i]), true
			if byID := *s.Tracker.byID.Load(); int(m.id) < len(byID) {
				m.tg = byID[m.id]
			}
			if s.StickyStore != nil {
				m.score = fnv64(s.Host.Addr(u))
			}
			maxID = max(maxID, int(ids[i]))
			st := s.Tracker.StatusOf(m.id)
			if st.Measured {
				v.fallback = false
			}
			v.members = append(v.members, m)
			if !st.Active {
				continue
			}
			bucket = st.Bucket
		} else {
			v.members = append(v.members, m)
		}
		if noBuckets {
			bucket = 0
		}
		active = append(active, ranked{m, bucket})
	}
	if v.fallback {
		// Nothing measured yet (cold start, or no probe ever succeeded):
		// latency says nothing, and a round that failed says little more
		// than Caddy's own health does, so every member is a candidate.
		v.groups = [][]member[U]{v.members}
	} else {
		slices.SortStableFunc(active, func(a, b ranked) int { return a.bucket - b.bucket })
		for i := 0; i < len(active); {
			j := i
			var g []member[U]
			for ; j < len(active) && active[j].bucket == active[i].bucket; j++ {
				g = append(g, active[j].m)
			}
			v.groups = append(v.groups, g)
			i = j
		}
		if len(active) > 0 {
			v.lowest = active[0].bucket
		}
	}
	v.byID = make([]int32, maxID+1)
	for i := range v.byID {
		v.byID[i] = -1
	}
	if s.StickyStore != nil {
		v.byAddr = make(map[string]int32, len(v.members))
	}
	for i, m := range v.members {
		if m.probed {
			v.byID[m.id] = int32(i)
			if v.byAddr != nil {
				v.byAddr[s.Host.Addr(m.u)] = int32(i)
			}
		}
	}
	return v
}

// Select picks an upstream for the (user, app) pair at now (unix ns): the
// pair's sticky publisher if it is still active and available, else a
// random (or least-loaded) available member of the lowest bucket that has
// one. While no member of the pool is measured, it picks among all
// available members and pins nothing. It returns ok false when no upstream
// is available.
func (s *Selector[U]) Select(pool []U, user, app string, now int64) (u U, d Decision, ok bool) {
	return s.sel(pool, user, app, now, s.Sticky != nil)
}

// SelectUnpinned picks as Select does for a request that has no (user,
// app) pair: it neither follows nor makes a pin.
func (s *Selector[U]) SelectUnpinned(pool []U, now int64) (u U, d Decision, ok bool) {
	return s.sel(pool, "", "", now, false)
}

func (s *Selector[U]) sel(pool []U, user, app string, now int64, pinned bool) (u U, d Decision, ok bool) {
	if len(pool) == 0 {
		return u, d, false
	}
	v := s.currentView(pool, now)
	var key uint64
	if pinned {
		key = s.Sticky.Key(user, app)
		if val, hit := s.Sticky.Get(key, now); hit {
			if id := sticky.ID(val); int(id) < len(v.byID) && v.byID[id] >= 0 {
				m := v.members[v.byID[id]]
				// No count here: a local hit costs what it cost without a
				// shared level (the adapter counts sticky decisions anyway).
				// With latency traffic or both a pin also ends when its
				// publisher is out of the lowest bucket (under hysteresis,
				// on the confirmed peak-EWMA: one slow answer moves none).
				if st := s.Tracker.StatusOf(id); st != nil && st.Active && s.Host.Available(m.u) &&
					(!v.movePins || v.fallback || !st.Measured || st.Bucket <= v.lowest) {
					if s.StickyStore != nil {
						if s.StickyStore.reconcilable(key, now) {
							// Pinned here without the store's word:
							// settle it with the store, off the path.
							s.StickyStore.reconcile(key, user, app, st.Addr, s.adopter(key, now))
						} else if e := s.StickyStore.epochAt(now); sticky.Tag(val) != e {
							// Once per epoch (half the TTL) a pair in use
							// here renews its store entry, off the path.
							s.Sticky.Put(key, sticky.Tagged(id, e), now)
							s.StickyStore.refresh(user, app, st.Addr)
						}
					}
					return m.u, Decision{Status: st, Sticky: true}, true
				}
			}
		}
	}
	// The shared level: only for a pin this pool would make (some member
	// measured), so a cold start costs no store call per request.
	var skey string
	overwrite := false
	shared := pinned && s.StickyStore != nil && !v.fallback
	if shared {
		skey = s.StickyStore.Key(user, app)
		addr, found, bad, _ := s.StickyStore.lookup(skey)
		overwrite = bad
		if found {
			if m, st, usable, member := s.fromStore(v, addr); usable {
				s.Sticky.Put(key, sticky.Tagged(m.id, s.StickyStore.epochAt(now)), now)
				s.StickyStore.stats.pending.done(key)
				s.StickyStore.stats.StoreHits.Add(1)
				return m.u, Decision{Status: st, Sticky: true, FromStore: true}, true
			} else if member {
				s.StickyStore.stats.Stale.Add(1)
			} else {
				s.StickyStore.stats.Malformed.Add(1)
			}
			overwrite = true
		}
	}
	for _, g := range v.groups {
		var m *member[U]
		if shared && s.Within == WithinRandom {
			m = s.pickFor(g, skey)
		} else {
			m = s.pick(g, now)
		}
		if m == nil {
			continue
		}
		if m.warmSince != 0 {
			m = s.temper(g, m, now)
		}
		if m.probed {
			if m.tg != nil { // its target, as the view was built: one load less
				d.Status = m.tg.status.Load()
			} else {
				d.Status = s.Tracker.StatusOf(m.id)
			}
			// A pick made before anything in the pool was measured is not
			// latency-based: do not pin the pair to it.
			if pinned && !v.fallback && (d.Status.Measured || s.Tracker.cfg.Load().NoBuckets) {
				if shared {
					// Another replica may have pinned the pair since our
					// lookup (or before it, if the lookup got no answer):
					// its pin wins if it is usable here.
					winner, won, synced := s.StickyStore.claim(skey, d.Status.Addr, overwrite)
					if !won {
						if wm, wst, usable, _ := s.fromStore(v, winner); usable {
							s.StickyStore.stats.Adopted.Add(1)
							m, d.Status = &wm, wst
						} else {
							_, _, synced = s.StickyStore.claim(skey, d.Status.Addr, true)
						}
					}
					if synced {
						s.StickyStore.stats.pending.done(key)
					} else if !s.StickyStore.stats.pending.add(key, now, s.StickyStore.ttl.Load()) {
						s.StickyStore.stats.PendingDropped.Add(1)
					}
				}
				val := m.id
				if shared {
					val = sticky.Tagged(m.id, s.StickyStore.epochAt(now))
				}
				s.Sticky.Put(key, val, now)
			}
		}
		return m.u, d, true
	}
	return u, d, false
}

// adopter returns what a reconciliation calls when the store names
// another publisher for the pair of table key: the pair follows it here if
// it is usable.
func (s *Selector[U]) adopter(key uint64, now int64) func(string) bool {
	return func(winner string) bool {
		v := s.view.Load()
		if v == nil {
			return false
		}
		m, _, usable, _ := s.fromStore(v, winner)
		if usable {
			s.Sticky.Put(key, sticky.Tagged(m.id, s.StickyStore.epochAt(now)), now)
		}
		return usable
	}
}

// fromStore resolves a publisher address read from the shared store:
// usable if it is a measured-pool member that is active and available
// here; member if it is at least one of the pool's publishers.
func (s *Selector[U]) fromStore(v *view[U], addr string) (m member[U], st *Status, usable, member bool) {
	i, ok := v.byAddr[addr]
	if !ok {
		return m, nil, false, false
	}
	m = v.members[i]
	st = s.Tracker.StatusOf(m.id)
	usable = st != nil && st.Active && (st.Measured || s.Tracker.cfg.Load().NoBuckets) && s.Host.Available(m.u)
	return m, st, usable, true
}

func (s *Selector[U]) intN(n int) int {
	if s.IntN != nil {
		return s.IntN(n)
	}
	return rand.IntN(n)
}

func (s *Selector[U]) pick(g []member[U], now int64) *member[U] {
	switch s.Within {
	case WithinP2C:
		return s.pickP2C(g, now)
	case WithinLeastConn:
		return s.pickLeastConn(g)
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
