// Package peakewma keeps a peak-sensitive moving average of latencies
// (peak-EWMA, as Finagle and tower use for load balancing), updated
// lock-free: a few atomic operations per sample, no allocation.
//
// The rule, per sample x at time now:
//   - x is first confirmed by the answer before it: the figure is fed
//     c = min(x, previous sample). One slow answer among fast ones so
//     counts as fast; two slow answers in a row count as slow. This is
//     what keeps a single slow request from moving anything.
//   - peak: if c is above the current peak it becomes the peak at once;
//     otherwise the peak decays towards c with the half-life:
//     peak = c + (peak-c)·2^(-Δt/halfLife), Δt the time since the last
//     counted sample.
//   - avg: a plain time-weighted EWMA with the same half-life:
//     avg = c + (avg-c)·2^(-Δt/halfLife).
//
// Reading (Value) also decays both figures towards a floor (the caller's
// probe latency) over the time since the last sample, so a publisher that
// stopped receiving traffic after a slow spell is not judged by it for
// ever: after k half-lives idle only 2^-k of its excess remains.
package peakewma

import (
	"math"
	"sync/atomic"
	"time"
)

// EWMA is one upstream's observed latency. The zero value is empty and
// ready; it must not be copied after first use.
type EWMA struct {
	last  atomic.Int64  // previous raw sample, ns (0: none yet)
	stamp atomic.Int64  // unix ns of the last counted sample (0: none)
	peak  atomic.Uint64 // float64 bits, ns
	avg   atomic.Uint64 // float64 bits, ns
	n     atomic.Uint64 // counted samples
}

// Observe folds sample d taken at now (unix ns) into the figures, with
// halfLife the decay half-life.
func (e *EWMA) Observe(d time.Duration, now int64, halfLife time.Duration) {
	x := max(int64(d), 1)
	prev := e.last.Swap(x)
	if prev == 0 {
		return // nothing to confirm it yet
	}
	c := float64(min(x, prev))
	then := e.stamp.Swap(now)
	if e.n.Add(1) == 1 || then == 0 {
		e.peak.Store(math.Float64bits(c))
		e.avg.Store(math.Float64bits(c))
		return
	}
	w := decay(now-then, halfLife)
	for {
		old := e.peak.Load()
		p := math.Float64frombits(old)
		np := c
		if c < p {
			np = c + (p-c)*w
		}
		if e.peak.CompareAndSwap(old, math.Float64bits(np)) {
			break
		}
	}
	for {
		old := e.avg.Load()
		a := math.Float64frombits(old)
		if e.avg.CompareAndSwap(old, math.Float64bits(c+(a-c)*w)) {
			break
		}
	}
}

// decay is 2^(-dt/halfLife), the weight the old figure keeps after dt.
func decay(dt int64, halfLife time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	if halfLife <= 0 {
		return 0
	}
	return math.Exp2(-float64(dt) / float64(halfLife))
}

// Value returns the average and peak at now, each decayed towards floor
// over the time since the last counted sample, and how many samples were
// counted (0: none, the figures are then 0).
func (e *EWMA) Value(now int64, halfLife, floor time.Duration) (avg, peak time.Duration, n uint64) {
	n = e.n.Load()
	if n == 0 {
		return 0, 0, 0
	}
	w := decay(now-e.stamp.Load(), halfLife)
	f := float64(floor)
	at := func(v float64) time.Duration {
		if v > f {
			v = f + (v-f)*w
		}
		return time.Duration(v)
	}
	return at(math.Float64frombits(e.avg.Load())), at(math.Float64frombits(e.peak.Load())), n
}

// Reset forgets every sample.
func (e *EWMA) Reset() {
	e.n.Store(0)
	e.stamp.Store(0)
	e.last.Store(0)
	e.peak.Store(0)
	e.avg.Store(0)
}
