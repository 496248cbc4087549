// Package peakewma keeps a peak-sensitive moving average of latencies
// (peak-EWMA, as Finagle and tower use for load balancing). Recording a
// sample (Observe, on the request path) is two atomic read-modify-writes
// and a load: no lock, no allocation, no clock read. The samples recorded
// since the last read are folded into the figures when the owner reads
// them (Value), which it does on its own schedule (the latency_bucket
// policy: every 250 ms and at every probe round).
//
// The rule, per sample x:
//   - x is first confirmed by the answer before it: the figure is fed
//     c = min(x, previous sample). One slow answer among fast ones so
//     counts as fast; two slow answers in a row count as slow. This is
//     what keeps a single slow request from moving anything.
//
// and per fold, of the k confirmed samples since the last one (mean m,
// highest top), Δt after the last fold that had samples:
//   - avg: a time-weighted EWMA with the half-life:
//     avg = m + (avg-m)·2^(-Δt/halfLife);
//   - peak: decays towards the samples with the same half-life, and a
//     sample above it becomes the peak at once:
//     peak = max(top, m + (peak-m)·2^(-Δt/halfLife)).
//
// Folded one sample at a time this is exactly tower's per-sample
// peak-EWMA; folded every 250 ms it differs from it only by the decay
// within one fold interval (at a 10 s half-life, under 2 %).
//
// Reading (Value) also decays both figures towards a floor (the caller's
// probe latency) over the time since the last fold with samples, so a
// publisher that stopped receiving traffic after a slow spell is not
// judged by it for ever: after k half-lives idle only 2^-k of its excess
// remains.
package peakewma

import (
	"math"
	"sync/atomic"
	"time"
)

// A batch packs the confirmed samples since the last fold into one word,
// so that recording one is a single atomic add: their count in the low
// countBits bits, the sum of their latencies in microseconds above. A fold
// interval may hold up to 2^20-1 samples (a million per 250 ms: 4 million
// requests a second to one upstream) whose sum stays below 2^44 µs
// (200 days), far above what one proxy sends.
const (
	countBits = 20
	countMask = 1<<countBits - 1
)

// EWMA is one upstream's observed latency. The zero value is empty and
// ready; it must not be copied after first use. Observe may run at any
// time, concurrently with anything; Value and Reset must not run
// concurrently with each other (the owner's lock orders them).
type EWMA struct {
	last  atomic.Int64  // previous raw sample, ns (0: none yet)
	batch atomic.Uint64 // confirmed samples since the last fold: sum µs << countBits | count
	top   atomic.Int64  // highest confirmed sample since the last fold, ns

	// Owned by Value and Reset.
	stamp     int64   // time of the last fold that had samples (0: none)
	peak, avg float64 // ns
	n         uint64  // samples folded
}

// Observe records sample d and returns it as confirmed (the lower of it
// and the sample before it; 0 for the first, which nothing confirms).
func (e *EWMA) Observe(d time.Duration) time.Duration {
	x := max(int64(d), 1)
	prev := e.last.Swap(x)
	if prev == 0 {
		return 0 // nothing to confirm it yet
	}
	c := min(x, prev)
	e.batch.Add(uint64(c/1e3)<<countBits | 1)
	for {
		top := e.top.Load()
		if c <= top || e.top.CompareAndSwap(top, c) {
			return time.Duration(c)
		}
	}
}

// fold moves the samples recorded since the last fold into the figures.
func (e *EWMA) fold(now int64, halfLife time.Duration) {
	b := e.batch.Swap(0)
	k := b & countMask
	if k == 0 {
		return
	}
	top := float64(e.top.Swap(0))
	mean := float64(b>>countBits) * 1e3 / float64(k)
	top = max(top, mean) // µs rounding, or a top taken by the next fold
	if e.n == 0 || e.stamp == 0 {
		e.avg, e.peak = mean, top
	} else {
		w := decay(now-e.stamp, halfLife)
		e.avg = mean + (e.avg-mean)*w
		e.peak = max(top, mean+(e.peak-mean)*w)
	}
	e.n += k
	e.stamp = now
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

// Value folds the samples recorded since the last call at now (ns, any
// clock the owner keeps to) with halfLife, and returns the average and
// peak, each decayed towards floor over the time since the last fold that
// had samples, and how many samples were counted (0: none, the figures are
// then 0).
func (e *EWMA) Value(now int64, halfLife, floor time.Duration) (avg, peak time.Duration, n uint64) {
	e.fold(now, halfLife)
	if e.n == 0 {
		return 0, 0, 0
	}
	w := decay(now-e.stamp, halfLife)
	f := float64(floor)
	at := func(v float64) time.Duration {
		if v > f {
			v = f + (v-f)*w
		}
		return time.Duration(v)
	}
	return at(e.avg), at(e.peak), e.n
}

// Reset forgets every sample.
func (e *EWMA) Reset() {
	e.last.Store(0)
	e.batch.Store(0)
	e.top.Store(0)
	e.stamp, e.peak, e.avg, e.n = 0, 0, 0, 0
}
