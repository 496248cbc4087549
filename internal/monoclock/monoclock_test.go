package monoclock

import (
	"testing"
	"time"
)

// Now follows the monotonic clock from the start's wall time: two reads
// differ in UnixNano exactly as their monotonic difference, and it starts
// at the process's wall clock.
func TestNowFollowsTheMonotonicClock(t *testing.T) {
	a := Now()
	time.Sleep(20 * time.Millisecond)
	b := Now()
	if d, w := b.Sub(a), time.Duration(b.UnixNano()-a.UnixNano()); d != w || d < 20*time.Millisecond {
		t.Fatalf("monotonic difference %v, wall difference %v: want equal, at least 20ms", d, w)
	}
	if off := time.Since(Now()); off < 0 || off > time.Second {
		t.Fatalf("Now is %v behind the monotonic now", off)
	}
	if w := time.Now().UnixNano() - Now().UnixNano(); w > int64(time.Second) || w < -int64(time.Second) {
		t.Fatalf("Now is %v off the wall clock on a host whose clock did not step", time.Duration(w))
	}
}
