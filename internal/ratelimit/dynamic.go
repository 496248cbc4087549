package ratelimit

import (
	"fmt"
	"time"
)

// Step is one row of the threshold table: at a load of AtLeast percent or
// more, withhold Throttle percent of the static rate.
type Step struct {
	AtLeast  float64
	Throttle int
}

// Dynamic is the controller of dynamic rate limiting as Cisco vDRA does it:
//
//   - at or above a table threshold, the throttle is that row's value
//     (the highest row the load reaches), up or down;
//   - below the reversal threshold for a whole hold time, the throttle
//     drops by one step, and again after each further hold time;
//   - in between (below the table, not below the reversal threshold) the
//     throttle stays, and the hold time starts over.
//
// It is driven by samples (Sample) with their times, so tests inject both.
type Dynamic struct {
	table    []Step
	reversal float64
	hold     time.Duration
	step     int

	throttle    int
	belowSince  time.Time // zero while not below the reversal threshold
	lastLoad    float64
	lastSampled time.Time
}

// Defaults of the reversal: after 30 s below the reversal threshold, the
// throttle drops by 20 points.
const (
	DefaultReversalHold = 30 * time.Second
	DefaultReversalStep = 20
)

// NewDynamic validates and returns a controller. The table must be sorted
// by threshold, with thresholds and throttles in 0–100 and throttles not
// decreasing; the reversal threshold must not exceed the lowest threshold.
func NewDynamic(table []Step, reversal float64, hold time.Duration, step int) (*Dynamic, error) {
	if len(table) == 0 {
		return nil, fmt.Errorf("threshold table is empty")
	}
	for i, s := range table {
		if s.AtLeast < 0 || s.AtLeast > 100 {
			return nil, fmt.Errorf("threshold %v%%: must be within 0-100", s.AtLeast)
		}
		if s.Throttle < 0 || s.Throttle > 100 {
			return nil, fmt.Errorf("throttle %d%% at %v%%: must be within 0-100", s.Throttle, s.AtLeast)
		}
		if i > 0 && (s.AtLeast <= table[i-1].AtLeast || s.Throttle < table[i-1].Throttle) {
			return nil, fmt.Errorf("threshold table not monotonic at %v%% → %d%%: thresholds must rise and throttles must not fall", s.AtLeast, s.Throttle)
		}
	}
	if reversal < 0 || reversal > table[0].AtLeast {
		return nil, fmt.Errorf("reversal threshold %v%%: must be within 0 and the lowest threshold %v%%", reversal, table[0].AtLeast)
	}
	if hold <= 0 {
		return nil, fmt.Errorf("reversal hold %v: must be positive", hold)
	}
	if step < 1 || step > 100 {
		return nil, fmt.Errorf("reversal step %d%%: must be within 1-100", step)
	}
	return &Dynamic{table: table, reversal: reversal, hold: hold, step: step}, nil
}

// Sample feeds one load reading taken at now and returns the throttle in
// percent.
func (d *Dynamic) Sample(load float64, now time.Time) int {
	d.lastLoad, d.lastSampled = load, now
	if level, ok := d.level(load); ok {
		d.throttle, d.belowSince = level, time.Time{}
		return d.throttle
	}
	if load >= d.reversal {
		d.belowSince = time.Time{}
		return d.throttle
	}
	switch {
	case d.throttle == 0:
		d.belowSince = time.Time{}
	case d.belowSince.IsZero():
		d.belowSince = now
	case now.Sub(d.belowSince) >= d.hold:
		d.throttle = max(0, d.throttle-d.step)
		d.belowSince = now
	}
	return d.throttle
}

func (d *Dynamic) level(load float64) (int, bool) {
	for i := len(d.table) - 1; i >= 0; i-- {
		if load >= d.table[i].AtLeast {
			return d.table[i].Throttle, true
		}
	}
	return 0, false
}

// Continue makes d, a controller built from a new configuration, go on
// where prev left off: its level, the start of the time below the
// reversal threshold (so a hold in progress is not restarted), and the
// last sample. A level above d's highest table throttle is lowered to it:
// the new table says the backend is never to be throttled more. The new
// table, reversal threshold, hold and step apply from the next sample.
func (d *Dynamic) Continue(prev *Dynamic) {
	d.throttle = min(prev.throttle, d.table[len(d.table)-1].Throttle)
	d.belowSince, d.lastLoad, d.lastSampled = prev.belowSince, prev.lastLoad, prev.lastSampled
	if d.throttle == 0 {
		d.belowSince = time.Time{}
	}
}

// ReversalSince returns when the load went below the reversal threshold
// (the start of the hold in progress), or zero.
func (d *Dynamic) ReversalSince() time.Time { return d.belowSince }

// Throttle returns the current throttle in percent.
func (d *Dynamic) Throttle() int { return d.throttle }

// Last returns the last load sampled and when.
func (d *Dynamic) Last() (float64, time.Time) { return d.lastLoad, d.lastSampled }

// Hold returns the reversal hold time.
func (d *Dynamic) Hold() time.Duration { return d.hold }
