// Package latency measures round-trip times with active probes and sorts
// them into exponential buckets. It knows nothing of Caddy or CoreDNS: the
// latency_bucket selection policies and the ogs plugin both use it.
package latency

import (
	"math/bits"
	"strconv"
	"time"
)

// Unmeasured is the bucket of a target with no measurement yet: it ranks
// after every measured bucket.
const Unmeasured = 1 << 30

// Bucket returns the index of the bucket holding d for width w: bucket 0 is
// [0,w), bucket 1 [w,2w), bucket 2 [2w,4w), bucket k [2^(k-1)·w, 2^k·w).
// A latency on a boundary belongs to the higher bucket: with w = 32 ms,
// 32 ms is in [32,64) and 64 ms in [64,128).
func Bucket(d, w time.Duration) int {
	if w <= 0 {
		panic("latency: bucket width must be positive")
	}
	if d < w {
		return 0
	}
	return bits.Len64(uint64(d / w))
}

// Range returns the bounds [lo, hi) of bucket b for width w.
func Range(b int, w time.Duration) (lo, hi time.Duration) {
	if b == 0 {
		return 0, w
	}
	return w << (b - 1), w << b
}

// Rebucket returns the bucket for a new measurement d of a target that was in
// bucket prev, with hysteresis h (a fraction, e.g. 0.1): the target stays in
// prev while d lies within prev's range widened by h of its bounds on each
// side, [lo·(1−h), hi·(1+h)); once d leaves that band it moves to Bucket(d, w).
// So a target hovering around a boundary does not flap between two buckets
// on every probe. prev == Unmeasured, or h == 0, gives Bucket(d, w).
func Rebucket(prev int, d, w time.Duration, h float64) int {
	if prev == Unmeasured || h <= 0 {
		return Bucket(d, w)
	}
	lo, hi := Range(prev, w)
	if d >= time.Duration(float64(lo)*(1-h)) && d < time.Duration(float64(hi)*(1+h)) {
		return prev
	}
	return Bucket(d, w)
}

// Label renders bucket b as Netskope's publisher view does, in milliseconds: "[0,32)",
// "[32,64)"; widths below a millisecond are shown in microseconds.
func Label(b int, w time.Duration) string {
	if b == Unmeasured {
		return "unmeasured"
	}
	lo, hi := Range(b, w)
	if w%time.Millisecond != 0 {
		return "[" + strconv.FormatInt(lo.Microseconds(), 10) + "us," + strconv.FormatInt(hi.Microseconds(), 10) + "us)"
	}
	return "[" + strconv.FormatInt(lo.Milliseconds(), 10) + "," + strconv.FormatInt(hi.Milliseconds(), 10) + ")"
}
