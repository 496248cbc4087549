package pubsel

import (
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/sticky"
)

// draws returns an IntN that answers the given draws in turn (each taken
// modulo n), so a test decides which two members p2c compares.
func draws(seq ...int) func(int) int {
	i := 0
	return func(n int) int {
		v := seq[i%len(seq)] % n
		i++
		return v
	}
}

// inFlight puts k requests in flight to addr.
func inFlight(tr *Tracker, addr string, k int) []Flight {
	var fs []Flight
	for range k {
		fs = append(fs, tr.Begin(addr))
	}
	return fs
}

// p2c takes, of two drawn members of the lowest bucket, the one of lower
// latency × (in flight + 1), and never looks outside the lowest bucket.
func TestP2CPicksLowerCost(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(4)
	for i, d := range []time.Duration{5 * ms, 8 * ms, 6 * ms, 70 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	pick := func(seq ...int) *up {
		t.Helper()
		s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(seq...)}
		u, d, ok := s.SelectUnpinned(p, 0)
		if !ok || d.Status == nil {
			t.Fatalf("no pick")
		}
		return u
	}
	// Idle: the faster of the two. Draws (0, 0) compare members 0 and 1;
	// (1, 0) compare 1 and 0.
	if u := pick(0, 0); u != p[0] {
		t.Fatalf("idle 5 ms vs 8 ms: picked %s", u.addr)
	}
	if u := pick(1, 0); u != p[0] {
		t.Fatalf("idle 8 ms vs 5 ms: picked %s", u.addr)
	}
	// 5 ms with one in flight (10) against 8 ms idle (8): the idle one.
	f0 := inFlight(tr, p[0].addr, 1)
	if u := pick(0, 0); u != p[1] {
		t.Fatalf("5 ms×2 vs 8 ms×1: picked %s", u.addr)
	}
	// 8 ms with one in flight too (16): back to the 5 ms one (10).
	f1 := inFlight(tr, p[1].addr, 1)
	if u := pick(0, 0); u != p[0] {
		t.Fatalf("5 ms×2 vs 8 ms×2: picked %s", u.addr)
	}
	for _, f := range append(f0, f1...) {
		f.Done()
	}
	if n := tr.LoadOf(0, 0).InFlight; n != 0 {
		t.Fatalf("in flight %d after every Done", n)
	}
	// The 70 ms publisher, idle, is never a candidate: it is not in the
	// lowest bucket, whatever the load of the others.
	inFlight(tr, p[0].addr, 50)
	inFlight(tr, p[1].addr, 50)
	inFlight(tr, p[2].addr, 50)
	for seq := range 9 {
		if u := pick(seq, seq/3); u == p[3] {
			t.Fatalf("p2c left the lowest bucket")
		}
	}
}

// The estimate is the traffic's peak-EWMA once traffic is counted (a
// failure as FailureLatency), else the probe latency.
func TestP2CEstimateFromTraffic(t *testing.T) {
	tr := newTracker(t, Config{FailureLatency: 900 * ms})
	p := pubs(2)
	measure(t, tr, p[0].addr, 5*ms)
	measure(t, tr, p[1].addr, 6*ms)
	if e := tr.LoadOf(0, 0).Estimate; e != 5*ms {
		t.Fatalf("estimate before traffic %v, want the probe's 5ms", e)
	}
	// Publisher 0 answers slowly twice in a row (confirmed): 40 ms.
	for range 2 {
		f := tr.Begin(p[0].addr)
		tr.ObserveFlight(f, 40*ms, false)
		f.Done()
	}
	tr.Reevaluate(time.Now())
	if l := tr.LoadOf(0, 0); l.Estimate < 39*ms || l.Estimate > 41*ms || l.Cost != l.Estimate {
		t.Fatalf("estimate %v cost %v after two 40 ms answers", l.Estimate, l.Cost)
	}
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0)}
	if u, _, _ := s.SelectUnpinned(p, 0); u != p[1] {
		t.Fatalf("picked %s: its traffic is slower than the other's probe", u.addr)
	}
	// Publisher 1 fails fast twice: that counts as the failure latency.
	for range 2 {
		f := tr.Begin(p[1].addr)
		tr.ObserveFlight(f, ms, true)
		f.Done()
	}
	tr.Reevaluate(time.Now())
	if e := tr.LoadOf(1, 0).Estimate; e < 899*ms {
		t.Fatalf("estimate %v after two failures, want 900ms", e)
	}
	if u, _, _ := s.SelectUnpinned(p, 0); u != p[0] {
		t.Fatalf("picked %s, which fails fast", u.addr)
	}
}

// A drawn member that is unavailable gives way to the other; with both
// unavailable any available member is taken.
func TestP2CUnavailable(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	for _, x := range p {
		measure(t, tr, x.addr, 5*ms)
	}
	inFlight(tr, p[1].addr, 5)
	p[0].down = true
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0)}
	if u, _, _ := s.SelectUnpinned(p, 0); u != p[1] {
		t.Fatalf("picked %s: 0 is down, 1 the other drawn", u.addr)
	}
	p[1].down = true
	if u, _, ok := s.SelectUnpinned(p, 0); !ok || u != p[2] {
		t.Fatalf("picked %v: only 2 is up", u)
	}
}

// Stickiness is unchanged: a pinned pair stays on its publisher however
// loaded it is; only new pairs are placed by cost.
func TestP2CKeepsPins(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(2)
	measure(t, tr, p[0].addr, 5*ms)
	measure(t, tr, p[1].addr, 5*ms)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0),
		Sticky: sticky.New(100, time.Hour)}
	u, _, _ := s.Select(p, "alice", "app", 1)
	if u != p[0] {
		t.Fatalf("first pick %s", u.addr)
	}
	inFlight(tr, p[0].addr, 10)
	for i := range 20 {
		if v, d, _ := s.Select(p, "alice", "app", int64(i)); v != p[0] || !d.Sticky {
			t.Fatalf("pinned pair moved to %s (sticky %v)", v.addr, d.Sticky)
		}
	}
	if v, _, _ := s.Select(p, "bob", "app", 1); v != p[1] {
		t.Fatalf("new pair went to the loaded publisher")
	}
}

// Over many picks with random draws, a publisher with requests piling up
// gets few new ones, and two equally loaded ones share evenly.
func TestP2CSpreadsByLoad(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(4)
	for _, x := range p {
		measure(t, tr, x.addr, 5*ms)
	}
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C}
	c := map[*up]int{}
	for range 4000 {
		u, _, _ := s.SelectUnpinned(p, 0)
		c[u]++
		if u == p[3] {
			tr.Begin(u.addr) // 3 never finishes anything
		}
	}
	// Only a draw of 3 with itself could choose it, and draws are distinct:
	// it gets picks until its in-flight count outweighs the others' zero.
	if c[p[3]] != 1 {
		t.Fatalf("stuck publisher got %d picks: %v", c[p[3]], c)
	}
	for _, x := range p[:3] {
		if c[x] < 1100 || c[x] > 1570 {
			t.Fatalf("idle publishers' shares %v", c)
		}
	}
}
