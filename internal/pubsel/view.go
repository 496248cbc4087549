package pubsel

import (
	"slices"
	"unsafe"

	"github.com/edgesteer/edgesteer/internal/latency"
)

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

// ranked is an active member with the bucket it is grouped by.
type ranked[U comparable] struct {
	m      member[U]
	bucket int
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

// build makes the view of pool: its members, the active ones grouped by
// bucket, and the lookups of a pin's publisher.
func (s *Selector[U]) build(pool []U) *view[U] {
	// Register first: Ensure may bump the generation, and the view must
	// carry the generation its statuses were read at or after.
	ids := make([]int64, len(pool))
	maxID := s.register(pool, ids)
	v := &view[U]{gen: s.Tracker.Generation(), first: unsafe.SliceData(pool), size: len(pool), fallback: true}
	cfg := s.Tracker.cfg.Load()
	v.movePins = cfg.Source != FromProbe && !cfg.NoBuckets
	var active []ranked[U]
	for i, u := range pool {
		if m, bucket, ok := s.addMember(v, u, ids[i]); ok {
			if cfg.NoBuckets {
				bucket = 0
			}
			active = append(active, ranked[U]{m, bucket})
		}
	}
	if v.fallback {
		// Nothing measured yet (cold start, or no probe ever succeeded):
		// latency says nothing, and a round that failed says little more
		// than Caddy's own health does, so every member is a candidate.
		v.groups = [][]member[U]{v.members}
	} else {
		v.group(active)
	}
	s.index(v, maxID)
	return v
}

// register makes a probe target of every member of pool that has a probe
// address (held by the selector's Holder, if any), sets its target id in
// ids, -1 for a member that has none, and returns the highest (-1: none).
func (s *Selector[U]) register(pool []U, ids []int64) (maxID int) {
	maxID = -1
	ensure := s.Tracker.Ensure
	if s.Holder != nil {
		ensure = s.Holder.Ensure
	}
	for i, u := range pool {
		ids[i] = -1
		if addr := s.Host.Addr(u); addr != "" {
			if id, err := ensure(addr); err == nil {
				ids[i] = int64(id)
				maxID = max(maxID, int(id))
			}
		}
	}
	return maxID
}

// addMember appends u, probed as target id (-1: not probed), to v.members,
// clears v.fallback if it is measured, and returns its member and bucket,
// and whether it is active: an unprobed member counts as active and
// unmeasured. A probed member carries its target (p2c's load figures)
// and, with a shared level, the hash of its address (the rendezvous pick).
func (s *Selector[U]) addMember(v *view[U], u U, id int64) (m member[U], bucket int, active bool) {
	m, bucket, active = member[U]{u: u}, latency.Unmeasured, true
	if id >= 0 {
		m.id, m.probed = uint32(id), true
		if byID := *s.Tracker.byID.Load(); int(m.id) < len(byID) {
			m.tg = byID[m.id]
		}
		if s.StickyStore != nil {
			m.score = fnv64(s.Host.Addr(u))
		}
		st := s.Tracker.StatusOf(m.id)
		if st.Measured {
			v.fallback = false
		}
		bucket, active = st.Bucket, st.Active
	}
	v.members = append(v.members, m)
	return m, bucket, active
}

// group sets v.groups to the active members grouped by bucket, lowest
// bucket first, each group in pool order, and v.lowest to that bucket.
func (v *view[U]) group(active []ranked[U]) {
	slices.SortStableFunc(active, func(a, b ranked[U]) int { return a.bucket - b.bucket })
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

// index fills v's lookups of a pinned publisher, maxID the highest target
// id of its members: by target id (the local table) and, with a shared
// level, by probe address (the store's values).
func (s *Selector[U]) index(v *view[U], maxID int) {
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
}
