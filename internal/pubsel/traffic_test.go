package pubsel

import (
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/sticky"
)

// trafficSetup: two publishers both at 5 ms by probe (window full), with
// the given latency source.
func trafficSetup(t *testing.T, src Source) (*Tracker, []*up) {
	t.Helper()
	tr := newTracker(t, Config{Window: 1, Source: src, HalfLife: 10 * time.Second})
	p := pubs(2)
	for _, u := range p {
		measure(t, tr, u.addr, 5*ms)
	}
	return tr, p
}

// observeN feeds n answers of latency d for addr, 1 ms apart from *now.
func observeN(tr *Tracker, addr string, d time.Duration, n int, now *time.Time) {
	for range n {
		*now = now.Add(ms)
		tr.Observe(addr, d, false)
	}
}

// The combination rule: probe ignores traffic; traffic takes the observed
// peak (even below the probe latency); both takes the higher.
func TestLatencySourceCombination(t *testing.T) {
	for _, c := range []struct {
		src      Source
		observed time.Duration
		want     time.Duration
		by       string
	}{
		{FromProbe, 200 * ms, 5 * ms, "probe"},
		{FromTraffic, 200 * ms, 200 * ms, "traffic"},
		{FromTraffic, 2 * ms, 2 * ms, "traffic"},
		{FromBoth, 200 * ms, 200 * ms, "traffic"},
		{FromBoth, 2 * ms, 5 * ms, "probe"},
	} {
		tr, p := trafficSetup(t, c.src)
		now := time.Now()
		observeN(tr, p[0].addr, c.observed, 5, &now)
		tr.Reevaluate(now)
		st := tr.StatusOf(0)
		if st.Latency < c.want-ms/10 || st.Latency > c.want+ms/10 || st.DecidedBy != c.by {
			t.Errorf("source %d, observed %v: latency %v by %s, want %v by %s", c.src, c.observed, st.Latency, st.DecidedBy, c.want, c.by)
		}
		if st.ProbeLatency != 5*ms || st.ObservedSamples == 0 {
			t.Errorf("source %d: probe %v samples %d", c.src, st.ProbeLatency, st.ObservedSamples)
		}
	}
}

// With traffic, a publisher slow in its answers leaves the lowest bucket:
// new users go to the fast one, and pinned users move at their next
// request; with probe nothing moves.
func TestTrafficMovesNewAndPinnedUsers(t *testing.T) {
	for _, src := range []Source{FromProbe, FromTraffic, FromBoth} {
		tr, p := trafficSetup(t, src)
		table := sticky.New(1000, time.Hour)
		s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}
		pinned := map[string]*up{}
		for i := range 40 {
			u, _, _ := s.Select(p, string(rune('a'+i)), "app", 1)
			pinned[string(rune('a'+i))] = u
		}
		now := time.Now()
		observeN(tr, p[0].addr, 5*ms, 3, &now)
		observeN(tr, p[1].addr, 5*ms, 3, &now)
		observeN(tr, p[0].addr, 300*ms, 3, &now) // publisher 1 turns slow
		tr.Reevaluate(now)
		moved := 0
		for user, was := range pinned {
			u, _, _ := s.Select(p, user, "app", 2)
			if u != was {
				moved++
			}
			if src != FromProbe && u == p[0] {
				t.Fatalf("source %d: pinned user %s stays on the slow publisher", src, user)
			}
		}
		c := counts(t, &Selector[*up]{Tracker: tr, Host: upHost{}}, p, 200, func(int) string { return "" })
		switch src {
		case FromProbe:
			if moved != 0 || c[p[0].addr] == 0 {
				t.Fatalf("probe: %d pins moved, new picks %v", moved, c)
			}
		default:
			if moved == 0 || c[p[0].addr] != 0 {
				t.Fatalf("source %d: %d pins moved, new picks %v", src, moved, c)
			}
		}
	}
}

// The one-slow-request rule: a burst of one slow answer (a timeout) per
// publisher moves no pinned user and leaves every bucket.
func TestOneSlowRequestMovesNoPin(t *testing.T) {
	for _, src := range []Source{FromTraffic, FromBoth} {
		tr, p := trafficSetup(t, src)
		table := sticky.New(1000, time.Hour)
		s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}
		now := time.Now()
		for _, u := range p {
			observeN(tr, u.addr, 5*ms, 5, &now)
		}
		pinned := map[string]*up{}
		for i := range 40 {
			u, _, _ := s.Select(p, string(rune('a'+i)), "app", 1)
			pinned[string(rune('a'+i))] = u
		}
		for _, u := range p {
			now = now.Add(ms)
			tr.Observe(u.addr, time.Millisecond, true) // failed: counts as the 2 s timeout
			observeN(tr, u.addr, 5*ms, 1, &now)
		}
		tr.Reevaluate(now)
		for i, u := range p {
			if st := tr.StatusOf(uint32(i)); st.Bucket != 0 {
				t.Fatalf("source %d: %s left [0,32) after one slow answer: %+v", src, u.addr, st)
			}
		}
		for user, was := range pinned {
			if u, d, _ := s.Select(p, user, "app", 2); u != was || !d.Sticky {
				t.Fatalf("source %d: one slow answer moved pinned user %s", src, user)
			}
		}
	}
}

// An error counts as the failure latency (the probe timeout by default):
// a publisher that fails fast is not fast.
func TestFailureCountsAsTimeout(t *testing.T) {
	tr, p := trafficSetup(t, FromTraffic)
	now := time.Now()
	for range 3 {
		now = now.Add(ms)
		tr.Observe(p[0].addr, time.Microsecond, true)
	}
	tr.Reevaluate(now)
	if st := tr.StatusOf(0); st.Latency < DefaultTimeout-ms || st.DecidedBy != "traffic" {
		t.Fatalf("after failures: %+v", st)
	}
}

// Hysteresis applies to the combined figure: a publisher at 30 ms hovering
// to 34 ms by traffic (inside [0,32) widened by 10 %) stays in [0,32).
func TestHysteresisOnCombinedFigure(t *testing.T) {
	tr, p := trafficSetup(t, FromTraffic)
	now := time.Now()
	observeN(tr, p[0].addr, 30*ms, 3, &now)
	tr.Reevaluate(now)
	observeN(tr, p[0].addr, 34*ms, 3, &now)
	tr.Reevaluate(now)
	if st := tr.StatusOf(0); st.Bucket != 0 || st.Latency < 33*ms {
		t.Fatalf("34 ms inside the band: %+v", st)
	}
	observeN(tr, p[0].addr, 40*ms, 3, &now)
	tr.Reevaluate(now)
	if st := tr.StatusOf(0); st.Bucket != 1 {
		t.Fatalf("40 ms outside the band: %+v", st)
	}
}

// Reloads: the observed figures live in the state's targets, so a new
// generation adopts them with the probe windows, also one that turns
// latency probe into both (then they decide at once), and one whose probe
// changes (the windows reset, the observed figures stay).
func TestObservedLatencySurvivesReload(t *testing.T) {
	st, err := NewState(settings(32 * ms))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gen1, _ := st.Lease("gen1", settings(32*ms))
	p := pubs(2)
	sel := &Selector[*up]{Tracker: st.Tracker(), Holder: gen1.Holder(), Host: upHost{}}
	sel.Select(p, "", "", 0)
	measure(t, st.Tracker(), p[0].addr, 5*ms)
	now := time.Now()
	observeN(st.Tracker(), p[0].addr, 200*ms, 4, &now)
	serve(st.Tracker(), p[0].addr, 200*ms, 2, 2) // begun with 2 in flight: observed_in_flight 2

	both := settings(32 * ms)
	both.Tracker.Source = FromBoth
	gen2, err := st.Lease("gen2", both)
	if err != nil {
		t.Fatal(err)
	}
	(&Selector[*up]{Tracker: st.Tracker(), Holder: gen2.Holder(), Host: upHost{}}).Select(p, "", "", 0)
	gen1.Release()
	st.Tracker().Reevaluate(now)
	s, _ := statusOf(st.Tracker(), p[0].addr)
	if s.ObservedSamples != 5 || s.DecidedBy != "traffic" || s.Latency < 190*ms || s.ObservedInFlight != 2 {
		t.Fatalf("after the reload to latency both: %+v", s)
	}

	reprobe := both
	reprobe.Tracker.ProbeID = "another probe"
	if _, err := st.Lease("gen3", reprobe); err != nil {
		t.Fatal(err)
	}
	measure(t, st.Tracker(), p[0].addr, 5*ms)
	st.Tracker().Reevaluate(now)
	if s, _ := statusOf(st.Tracker(), p[0].addr); s.ObservedSamples != 5 || s.Window != 1 || s.DecidedBy != "traffic" || s.ObservedInFlight != 2 {
		t.Fatalf("after a new probe: %+v", s)
	}
}
