package pubsel

import (
	"maps"
	"slices"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// Apply changes the settings of a tracker in use (a reload), keeping what
// stays comparable:
//   - a new ProbeID forgets every window (the old rounds measured something
//     else) and probes every target at once;
//   - a shorter Window drops the oldest rounds;
//   - latency and bucket are derived again at once from the kept windows:
//     a new BucketWidth or NoBuckets places each target afresh, without
//     hysteresis (its old bucket meant another range); a new segment keeps
//     the current bucket under the hysteresis rule;
//   - Probes, Timeout, Interval and Prober apply from the next round, and a
//     new Interval re-times the wait already under way.
func (t *Tracker) Apply(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.setDefaults()
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.cfg.Load()
	reprobe := cfg.ProbeID != old.ProbeID
	rebucket := cfg.BucketWidth != old.BucketWidth || cfg.NoBuckets != old.NoBuckets
	if reprobe {
		t.epoch.Add(1)
	}
	t.cfg.Store(&cfg)
	for _, tg := range t.targets {
		tg.mu.Lock()
		prev := tg.status.Load()
		st := *prev
		if reprobe {
			tg.window = nil
			st = *t.fresh(tg.addr, tg.id)
		}
		if len(tg.window) > cfg.Window {
			tg.window = slices.Clone(tg.window[len(tg.window)-cfg.Window:])
		}
		from := prev.Bucket
		if rebucket {
			from = latency.Unmeasured
		}
		t.derive(&st, tg, &cfg, from, "")
		tg.setStatus(&st)
		tg.mu.Unlock()
	}
	t.gen.Add(1)
	closeIdle(old.Prober)
	if reprobe || cfg.Interval != old.Interval {
		wake := make(chan struct{})
		close(*t.wake.Swap(&wake))
	}
	return nil
}

// sameSettings reports whether a and b configure a tracker alike (Prober
// and OnRound are compared through ProbeID only).
func sameSettings(a, b Config) bool {
	a.setDefaults()
	b.setDefaults()
	return a.BucketWidth == b.BucketWidth && a.NoBuckets == b.NoBuckets && a.Hysteresis == b.Hysteresis &&
		a.Probes == b.Probes && a.Interval == b.Interval && a.Timeout == b.Timeout && a.Window == b.Window &&
		a.ProbeID == b.ProbeID && a.MaxTargets == b.MaxTargets && maps.Equal(a.Segments, b.Segments) &&
		a.Source == b.Source && a.HalfLife == b.HalfLife && a.FailureLatency == b.FailureLatency &&
		a.ORCA == b.ORCA && a.ORCAPeriods == b.ORCAPeriods
}

// closeIdle closes the kept-alive connections of a prober being replaced
// (HTTP probes reuse connections); rounds under way finish regardless.
func closeIdle(old latency.Prober) {
	if c, ok := old.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
