package pubsel

import (
	"math"
	"sync/atomic"
	"time"
)

// flightLoad is the mean number of requests in flight to a target, the
// request itself included, that its measured requests saw when they
// began: the load at which its observed latency was measured. Recording
// one (on the request path) is one atomic add; the owner folds them into
// a time-weighted EWMA with the latency's half-life when it derives the
// status (under the target's mu), so both figures cover the same requests.
type flightLoad struct {
	batch atomic.Uint64 // since the last fold: sum of counts << countBits | requests

	// Owned by the folder.
	mean  float64 // 0 until the first fold with requests
	stamp int64   // time of that last fold, ns
}

const countBits = 20 // requests per fold interval, below 2^20

// add records one request that began with k in flight, itself included.
func (l *flightLoad) add(k int64) {
	if k > 0 {
		l.batch.Add(uint64(min(k, 1<<countBits))<<countBits | 1)
	}
}

// value folds the requests recorded since the last call at now and
// returns the mean, 1 until any request was recorded.
func (l *flightLoad) value(now int64, halfLife time.Duration) float64 {
	if b := l.batch.Swap(0); b&(1<<countBits-1) != 0 {
		m := float64(b>>countBits) / float64(b&(1<<countBits-1))
		if l.mean == 0 {
			l.mean = m
		} else {
			w := 0.0
			if halfLife > 0 {
				w = math.Exp2(-float64(max(now-l.stamp, 0)) / float64(halfLife))
			}
			l.mean = m + (l.mean-m)*w
		}
		l.stamp = now
	}
	return max(l.mean, 1)
}
