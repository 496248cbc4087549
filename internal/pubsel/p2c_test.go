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

// serve feeds n requests to addr, each begun with k in flight (itself
// included) and answered in d.
func serve(tr *Tracker, addr string, d time.Duration, k, n int) {
	for range n {
		fs := inFlight(tr, addr, k)
		tr.ObserveFlight(fs[k-1], d, false)
		for _, f := range fs {
			f.Done()
		}
	}
}

// The cost charges a publisher its latency per request it was measured
// at (PerRequest), not its whole latency once per request in flight: a
// fast publisher that serves four requests side by side in 5 ms each
// costs 5 ms at its usual load, and an idle one that answers in 50 ms is
// not taken over it (the traffic_tail benchmark: with latency × (in
// flight + 1) the slow one won whenever the fast one held 10 ms of
// peaks and four requests). A publisher that queues, measured at 40 ms
// with four in flight (10 ms each), costs 10 ms per request in flight,
// as latency × (in flight + 1) would at 10 ms.
func TestP2CCostPerRequestMeasured(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	for _, u := range p {
		measure(t, tr, u.addr, ms)
	}
	serve(tr, p[0].addr, 12*ms, 4, 100) // parallel, 12 ms peaks on a busy host
	serve(tr, p[1].addr, 50*ms, 1, 100) // slow, one at a time
	serve(tr, p[2].addr, 40*ms, 4, 100) // queues: 10 ms a request
	tr.Reevaluate(time.Now())
	fast, slow, queued := tr.LoadOf(0, 0), tr.LoadOf(1, 0), tr.LoadOf(2, 0)
	if st := tr.StatusOf(0); st.ObservedInFlight < 3.99 || st.ObservedInFlight > 4.01 {
		t.Fatalf("observed in flight %v, want 4", st.ObservedInFlight)
	}
	if fast.PerRequest < 2999*time.Microsecond || fast.PerRequest > 3001*time.Microsecond || slow.PerRequest < 49*ms {
		t.Fatalf("per request: fast %v (want 3ms), slow %v (want 50ms)", fast.PerRequest, slow.PerRequest)
	}
	if queued.PerRequest < 9999*time.Microsecond || queued.PerRequest > 10001*time.Microsecond {
		t.Fatalf("queued per request %v, want 10ms", queued.PerRequest)
	}
	fs := inFlight(tr, p[0].addr, 4) // its usual load now
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0)}
	if u, _, _ := s.SelectUnpinned(p[:2], 0); u != p[0] {
		t.Fatalf("picked %s: 12 ms with four in flight side by side against 50 ms idle", u.addr)
	}
	if c := tr.LoadOf(0, 0).Cost; c != 15*ms {
		t.Fatalf("fast cost with four in flight %v, want 3ms × 5", c)
	}
	for _, f := range fs {
		f.Done()
	}
}

// flightLoad's mean is the requests' own mean within a fold, an EWMA with
// the half-life across folds, held while idle, and 1 before any.
func TestFlightLoadMean(t *testing.T) {
	var l flightLoad
	if m := l.value(0, time.Second); m != 1 {
		t.Fatalf("empty mean %v, want 1", m)
	}
	l.add(2)
	l.add(4)
	l.add(0) // a request not counted in flight (Observe): not recorded
	if m := l.value(int64(time.Second), time.Second); m != 3 {
		t.Fatalf("mean %v, want 3", m)
	}
	l.add(7)
	if m := l.value(int64(2*time.Second), time.Second); m != 5 {
		t.Fatalf("mean after one half-life %v, want 5 (halfway from 3 to 7)", m)
	}
	if m := l.value(int64(10*time.Second), time.Second); m != 5 {
		t.Fatalf("idle mean %v, want 5 held", m)
	}
}

// The estimate is the traffic's moving average, not its peak: a stall
// that held a few answers of a busy fast publisher for 30 ms lifts its
// peak (bucketing by traffic sees it) but leaves its estimate near its
// usual 5 ms, so an idle publisher of 40 ms is not taken over it.
func TestP2CEstimateIsTheAverage(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(2)
	measure(t, tr, p[0].addr, ms)
	measure(t, tr, p[1].addr, ms)
	serve(tr, p[0].addr, 5*ms, 1, 200)
	serve(tr, p[0].addr, 30*ms, 1, 3) // the stall
	serve(tr, p[1].addr, 40*ms, 1, 2)
	tr.Reevaluate(time.Now())
	st, l := tr.StatusOf(0), tr.LoadOf(0, 0)
	if st.ObservedPeak < 29*ms || l.Estimate > 6*ms {
		t.Fatalf("after a stall: peak %v (want 30ms), estimate %v (want the average, about 5ms)", st.ObservedPeak, l.Estimate)
	}
	fs := inFlight(tr, p[0].addr, 4)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0)}
	if u, _, _ := s.SelectUnpinned(p, 0); u != p[0] {
		t.Fatalf("picked %s: the 40 ms publisher over a 5 ms one with a stall behind it", u.addr)
	}
	for _, f := range fs {
		f.Done()
	}
}

// A publisher whose idle estimate decayed back to its probe latency
// leaves the picks at its first confirmed slow answer, not at the next
// re-evaluation: a confirmed answer of more than twice its figure (per
// request, at the load the figure was measured at) lifts the figure at
// once (the re-evaluation then folds it in); one of less changes nothing
// until then.
func TestP2CLeavesAtTheAnswerThatCrosses(t *testing.T) {
	tr := newTracker(t, Config{HalfLife: time.Second})
	p := pubs(2)
	measure(t, tr, p[0].addr, ms)
	measure(t, tr, p[1].addr, ms)
	now := time.Now()
	serve(tr, p[0].addr, 50*ms, 1, 3)
	tr.Reevaluate(now)
	tr.Reevaluate(now.Add(20 * time.Second)) // idle for 20 half-lives
	if e := tr.LoadOf(0, 0).PerRequest; e > 2*ms {
		t.Fatalf("after 20 idle half-lives per request %v, want back near the 1ms probe", e)
	}
	serve(tr, p[0].addr, 50*ms, 1, 1) // confirmed by the 50 ms before it
	if e := tr.LoadOf(0, 0).PerRequest; e < 49*ms {
		t.Fatalf("after a confirmed 50 ms answer per request %v, want 50ms at once", e)
	}

	serve(tr, p[1].addr, 10*ms, 1, 10)
	tr.Reevaluate(now.Add(20 * time.Second))
	serve(tr, p[1].addr, 15*ms, 1, 3)
	if e := tr.LoadOf(1, 0).PerRequest; e != 10*ms {
		t.Fatalf("answers of 1.5× the expected moved the figure to %v before a re-evaluation, want 10ms", e)
	}
	serve(tr, p[1].addr, 25*ms, 1, 2)
	if e := tr.LoadOf(1, 0).PerRequest; e != 25*ms {
		t.Fatalf("confirmed answers of 2.5× the expected: per request %v, want 25ms at once", e)
	}
}
