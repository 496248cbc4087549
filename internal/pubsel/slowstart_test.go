package pubsel

import (
	"testing"
	"time"
)

// A publisher back in the lowest bucket (here: back from a failed round)
// gets a share of new picks rising linearly over slow_start: a quarter of
// its full share a quarter of the way in, three quarters at three
// quarters, all of it after. Its peers' picks make up the rest. Without
// slow start it has its full share at once; at the first view (cold
// start) nobody is slowed.
func TestSlowStartRisesLinearly(t *testing.T) {
	const window = 40 * time.Second
	for _, within := range []Within{WithinRandom, WithinP2C} {
		tr := newTracker(t, Config{})
		p := pubs(3)
		for _, x := range p {
			measure(t, tr, x.addr, 5*ms)
		}
		s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: within, SlowStart: window}
		share := func(at time.Duration) float64 {
			t.Helper()
			n := 0
			for range 6000 {
				u, _, _ := s.SelectUnpinned(p, int64(at))
				if u == p[2] {
					n++
				}
			}
			return float64(n) / 6000
		}
		t0 := 100 * time.Second
		if sh := share(t0); sh < 0.28 {
			t.Fatalf("%d: cold start slowed publisher 3: share %.3f", within, sh)
		}
		measure(t, tr, p[2].addr, 0) // a failed round: inactive
		share(t0)
		measure(t, tr, p[2].addr, 5*ms) // back: it re-enters the lowest bucket
		share(t0)                       // the view rebuilt at t0: its slow start begins
		for _, c := range []struct {
			at       time.Duration
			min, max float64
		}{
			{window / 4, 0.05, 0.12},     // 1/4 of 1/3
			{3 * window / 4, 0.20, 0.30}, // 3/4 of 1/3
			{window + time.Second, 0.28, 0.39},
		} {
			if sh := share(t0 + c.at); sh < c.min || sh > c.max {
				t.Errorf("within %d, %v into slow start: share %.3f, want %.2f–%.2f", within, c.at, sh, c.min, c.max)
			}
		}
		// Off: its full share at once.
		s2 := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: within}
		measure(t, tr, p[2].addr, 0)
		s2.SelectUnpinned(p, 0)
		measure(t, tr, p[2].addr, 5*ms)
		n := 0
		for range 6000 {
			if u, _, _ := s2.SelectUnpinned(p, 0); u == p[2] {
				n++
			}
		}
		if sh := float64(n) / 6000; sh < 0.28 {
			t.Errorf("within %d, slow start off: share %.3f right after its return", within, sh)
		}
	}
}
