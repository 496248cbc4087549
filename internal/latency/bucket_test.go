package latency

import (
	"testing"
	"time"
)

const ms = time.Millisecond

// The bucket boundaries: [0,32), [32,64), [64,128), [128,256)…; a
// latency on a boundary goes to the higher bucket.
func TestBucketBoundaries(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {10 * ms, 0}, {12 * ms, 0}, {32*ms - 1, 0},
		{32 * ms, 1}, {42 * ms, 1}, {64*ms - 1, 1},
		{64 * ms, 2}, {127 * ms, 2}, {128 * ms, 3}, {256 * ms, 4}, {512 * ms, 5}, {1024 * ms, 6},
	} {
		if got := Bucket(tc.d, 32*ms); got != tc.want {
			t.Errorf("Bucket(%v) = %d, want %d", tc.d, got, tc.want)
		}
		lo, hi := Range(tc.want, 32*ms)
		if tc.d < lo || tc.d >= hi {
			t.Errorf("%v not in Range(%d) = [%v,%v)", tc.d, tc.want, lo, hi)
		}
	}
}

func TestRebucketHysteresis(t *testing.T) {
	w := 32 * ms
	for _, tc := range []struct {
		prev int
		d    time.Duration
		h    float64
		want int
	}{
		{Unmeasured, 33 * ms, 0.1, 1}, // first measurement: plain bucket
		{0, 33 * ms, 0.1, 0},          // just over 32: stays in [0,32) (band up to 35.2)
		{0, 36 * ms, 0.1, 1},          // past the band: moves
		{1, 30 * ms, 0.1, 1},          // just under 32: stays in [32,64) (band from 28.8)
		{1, 28 * ms, 0.1, 0},          // past the band: moves
		{1, 68 * ms, 0.1, 1},          // stays (band up to 70.4)
		{1, 71 * ms, 0.1, 2},          // moves up
		{1, 200 * ms, 0.1, 3},         // jumps several buckets at once
		{0, 33 * ms, 0, 1},            // no hysteresis
	} {
		if got := Rebucket(tc.prev, tc.d, w, tc.h); got != tc.want {
			t.Errorf("Rebucket(%d, %v, h=%v) = %d, want %d", tc.prev, tc.d, tc.h, got, tc.want)
		}
	}
}

func TestLabel(t *testing.T) {
	for b, want := range []string{"[0,32)", "[32,64)", "[64,128)", "[128,256)"} {
		if got := Label(b, 32*ms); got != want {
			t.Errorf("Label(%d) = %q, want %q", b, got, want)
		}
	}
	if got := Label(1, 500*time.Microsecond); got != "[500us,1000us)" {
		t.Errorf("sub-ms label %q", got)
	}
}
