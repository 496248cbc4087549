package pubsel

import "github.com/edgesteer/edgesteer/internal/sticky"

// The keep rule: a (user, app) pair stays on the publisher it was given
// while that publisher stays usable here. Its pin is read from the local
// table (pinned, keeps; renew keeps the store in step) and, on a local
// miss, from the cluster's shared store (storedPin); a new pick is pinned
// at both levels (pin, claim).

// pair is a pinned pick's (user, app) once the local table has not
// decided it, with its keys.
type pair struct {
	user, app string
	key       uint64 // the local table's key
	// shared: the pick has the store as a second level, under skey (set on
	// a local miss). Only for a pin this pool would make (some member
	// measured), so a cold start costs no store call per request.
	shared bool
	skey   string
	// overwrite: the store holds no usable pin for the pair, so a claim
	// may replace its entry.
	overwrite bool
}

// pinned is the member a local pin names (table value val, if hit), nil
// if there is none or the pool has no such member.
func (v *view[U]) pinned(val uint32, hit bool) *member[U] {
	if !hit {
		return nil
	}
	id := sticky.ID(val)
	if int(id) >= len(v.byID) || v.byID[id] < 0 {
		return nil
	}
	return &v.members[v.byID[id]]
}

// keeps reports whether a pin to a publisher of status st holds, but for
// the framework's view of it (Host.Available): the publisher is active
// and, with latency traffic or both, not out of the lowest bucket (under
// hysteresis, on the confirmed peak-EWMA: one slow answer moves none).
func (v *view[U]) keeps(st *Status) bool {
	return st != nil && st.Active && (!v.movePins || v.fallback || !st.Measured || st.Bucket <= v.lowest)
}

// renew keeps the store in step with a local pin in use (table value val,
// publisher address addr), off the path: a pin made here without the
// store's word is settled with the store; else, once per epoch (half the
// TTL), the pair renews its store entry.
func (s *Selector[U]) renew(key uint64, user, app string, val uint32, addr string, now int64) {
	if s.StickyStore.reconcilable(key, now) {
		s.StickyStore.reconcile(key, user, app, addr, s.adopter(key, now))
	} else if e := s.StickyStore.epochAt(now); sticky.Tag(val) != e {
		s.Sticky.Put(key, sticky.Tagged(sticky.ID(val), e), now)
		s.StickyStore.refresh(user, app, addr)
	}
}

// storedPin is the store's pin for the pair, on a local miss, if it is
// usable here: it is then copied into the local table. Otherwise it sets
// p.overwrite if the store's entry may be replaced. Without a shared level
// for the pair it reads nothing.
func (s *Selector[U]) storedPin(v *view[U], p *pair, now int64) (*member[U], *Status, bool) {
	if !p.shared {
		return nil, nil, false
	}
	p.skey = s.StickyStore.Key(p.user, p.app)
	stats := s.StickyStore.stats
	addr, found, bad, _ := s.StickyStore.lookup(p.skey)
	p.overwrite = bad
	if !found {
		return nil, nil, false
	}
	m, st, usable, member := s.fromStore(v, addr)
	switch {
	case usable:
		s.Sticky.Put(p.key, sticky.Tagged(m.id, s.StickyStore.epochAt(now)), now)
		stats.pending.done(p.key)
		stats.StoreHits.Add(1)
		return m, st, true
	case member:
		stats.Stale.Add(1)
	default:
		stats.Malformed.Add(1)
	}
	p.overwrite = true
	return nil, nil, false
}

// pin pins the pair to m (status st), its new pick, and returns the
// publisher it is pinned to: m, or with a shared level the one another
// replica pinned it to first.
func (s *Selector[U]) pin(v *view[U], p *pair, m *member[U], st *Status, now int64) (*member[U], *Status) {
	val := m.id
	if p.shared {
		m, st = s.claim(v, p, m, st, now)
		val = sticky.Tagged(m.id, s.StickyStore.epochAt(now))
	}
	s.Sticky.Put(p.key, val, now)
	return m, st
}

// claim writes the pair's pin to m (status st) in the store. Another
// replica may have pinned the pair since the lookup (or before it, if the
// lookup got no answer): its pin wins if it is usable here. A claim the
// store did not answer is left pending, to be settled later.
func (s *Selector[U]) claim(v *view[U], p *pair, m *member[U], st *Status, now int64) (*member[U], *Status) {
	stats := s.StickyStore.stats
	winner, won, synced := s.StickyStore.claim(p.skey, st.Addr, p.overwrite)
	if !won {
		if wm, wst, usable, _ := s.fromStore(v, winner); usable {
			stats.Adopted.Add(1)
			m, st = wm, wst
		} else {
			_, _, synced = s.StickyStore.claim(p.skey, st.Addr, true)
		}
	}
	if synced {
		stats.pending.done(p.key)
	} else if !stats.pending.add(p.key, now, s.StickyStore.ttl.Load()) {
		stats.PendingDropped.Add(1)
	}
	return m, st
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
func (s *Selector[U]) fromStore(v *view[U], addr string) (m *member[U], st *Status, usable, member bool) {
	i, ok := v.byAddr[addr]
	if !ok {
		return nil, nil, false, false
	}
	m = &v.members[i]
	st = s.Tracker.StatusOf(m.id)
	usable = st != nil && st.Active && (st.Measured || s.Tracker.cfg.Load().NoBuckets) && s.Host.Available(m.u)
	return m, st, usable, true
}
