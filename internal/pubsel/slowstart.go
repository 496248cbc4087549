package pubsel

// Slow start: a publisher that (re)enters the lowest bucket, cold or just
// recovered, is not handed its full share of new picks at once. Over
// Selector.SlowStart its share rises linearly from 0: at a fraction w of
// the window, a new pick that falls on it is kept with probability w and
// otherwise made again among the members not in slow start. With one such
// publisher among n taking picks at random, it so gets w/n of them.

// warmup marks the members of v's lowest group that were not in prev's
// lowest group (a publisher newly measured into it, back from inactive, or
// back down from a higher bucket) as starting now, and carries over the
// start of those still within their window. A first view, or one after
// the cold-start fallback, starts nobody: every publisher is new alike.
func (s *Selector[U]) warmup(v, prev *view[U], now int64) {
	if prev == nil || prev.fallback || v.fallback || len(v.groups) == 0 || len(prev.groups) == 0 {
		return
	}
	was := make(map[uint32]int64, len(prev.groups[0]))
	for _, m := range prev.groups[0] {
		if m.probed {
			was[m.id] = m.warmSince
		}
	}
	window := int64(s.SlowStart)
	for i := range v.groups[0] {
		m := &v.groups[0][i]
		if !m.probed {
			continue
		}
		since, in := was[m.id]
		switch {
		case !in:
			m.warmSince = now
		case since != 0 && now-since < window:
			m.warmSince = since
		}
	}
}

// publishWarmup copies v's slow starts to its targets, where the admin
// view reads them (Tracker.LoadOf): the view is the selector's, and one
// config generation's, but the targets are the state's. Views are rebuilt
// only when a bucket, an activity or the pool changes.
func (s *Selector[U]) publishWarmup(v *view[U]) {
	for _, m := range v.members {
		if m.tg != nil {
			m.tg.warmSince.Store(0)
		}
	}
	if len(v.groups) == 0 {
		return
	}
	for _, m := range v.groups[0] {
		if m.tg != nil && m.warmSince != 0 {
			m.tg.warmSince.Store(m.warmSince)
			m.tg.warmWindow.Store(int64(s.SlowStart))
		}
	}
}

// warming reports whether m is in slow start at now.
func (s *Selector[U]) warming(m *member[U], now int64) bool {
	return m.warmSince != 0 && now-m.warmSince < int64(s.SlowStart)
}

// temper applies slow start to m, a new pick from group g at now: kept
// with probability (now − start) / SlowStart, else replaced by the first
// available member of g not in slow start from a random place (m if there
// is none).
func (s *Selector[U]) temper(g []member[U], m *member[U], now int64) *member[U] {
	if !s.warming(m, now) {
		return m
	}
	const scale = 1 << 20
	if w := float64(now-m.warmSince) / float64(s.SlowStart); s.intN(scale) < int(w*scale) {
		return m
	}
	n := len(g)
	start := s.intN(n)
	for i := range n {
		if c := &g[(start+i)%n]; !s.warming(c, now) && s.Host.Available(c.u) {
			return c
		}
	}
	return m
}

// SlowStartProgress returns how far target id is through its slow start at
// now, in [0, 1), and true; or false if it is not in slow start in the
// selector's current view (for the admin view).
func (s *Selector[U]) SlowStartProgress(id uint32, now int64) (float64, bool) {
	v := s.view.Load()
	if v == nil || s.SlowStart <= 0 || len(v.groups) == 0 {
		return 0, false
	}
	for i := range v.groups[0] {
		if m := &v.groups[0][i]; m.probed && m.id == id && s.warming(m, now) {
			return float64(now-m.warmSince) / float64(s.SlowStart), true
		}
	}
	return 0, false
}
