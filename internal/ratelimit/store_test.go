package ratelimit

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func mustRule(t *testing.T, name string, rate float64, burst int) *Rule {
	t.Helper()
	r, err := NewRule(name, rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// admitted counts the events admitted for key from..to, one every step.
func admitted(p *Profile, key string, from, to, step int64) int {
	n := 0
	for now := from; now < to; now += step {
		if ok, _ := p.Decide(key, "", now); ok {
			n++
		}
	}
	return n
}

// A peer that has used up its burst gets no fresh one from a new
// generation with the same settings, nor after the old one detaches.
func TestStoreNoFreshBurstAcrossGenerations(t *testing.T) {
	s := NewStore()
	t0 := int64(time.Hour)
	old := NewProfile("p", mustRule(t, "overall", 10, 5), nil, 100)
	g1 := s.Attach(Generation{Profiles: []*Profile{old}})
	if n := admitted(old, "peer", t0, t0+1, 1); n != 1 {
		t.Fatalf("first admitted %d", n)
	}
	for range 4 {
		old.Decide("peer", "", t0)
	}
	if ok, _ := old.Decide("peer", "", t0); ok {
		t.Fatal("burst of 5 exceeded")
	}
	cur := NewProfile("p", mustRule(t, "overall", 10, 5), nil, 100)
	s.Attach(Generation{Profiles: []*Profile{cur}})
	if ok, _ := cur.Decide("peer", "", t0); ok {
		t.Fatal("the new generation gave a fresh burst")
	}
	g1.Detach()
	if ok, _ := cur.Decide("peer", "", t0+50*ms); ok {
		t.Fatal("admitted before the interval of 100 ms passed")
	}
	if ok, _ := cur.Decide("peer", "", t0+100*ms); !ok {
		t.Fatal("not admitted after one interval")
	}
	if ok, _ := cur.Decide("other", "", t0); !ok {
		t.Fatal("another peer was refused")
	}
}

// A lowered or raised rate applies at once to the adopted buckets: the
// admissions a key has outstanding are kept (its debt scales by old rate /
// new rate), the new tolerance decides.
func TestStoreChangedRateCarriesDebt(t *testing.T) {
	t0 := int64(time.Hour)
	for _, c := range []struct {
		name                  string
		oldRate, newRate      float64
		oldBurst, newBurst    int
		firstAdmitted, inTenS int64 // ms after t0; count over 10 s from t0
	}{
		// 100/s burst 10 used up: 10 outstanding, a debt of 100 ms. At
		// 10/s that is 1 s; burst 1 (tolerance 0): the next admission at
		// t0+1 s, then every 100 ms: 90 in 10 s.
		{"lowered", 100, 10, 10, 1, 1000, 90},
		// 10/s burst 1 used up: 1 outstanding, 100 ms. At 100/s that is
		// 10 ms, within burst 10's tolerance of 90 ms: 9 more at once
		// (a fresh bucket would give 10), then one every 10 ms from
		// t0+10 ms: 9 + 999 in 10 s.
		{"raised", 10, 100, 1, 10, 0, 1008},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewStore()
			s.Clock = func() int64 { return t0 }
			old := NewProfile("p", mustRule(t, "overall", c.oldRate, c.oldBurst), nil, 100)
			g1 := s.Attach(Generation{Profiles: []*Profile{old}})
			for admitted(old, "peer", t0, t0+1, 1) == 1 {
			}
			cur := NewProfile("p", mustRule(t, "overall", c.newRate, c.newBurst), nil, 100)
			s.Attach(Generation{Profiles: []*Profile{cur}})
			g1.Detach()
			first := int64(-1)
			n := int64(0)
			for now := t0; now < t0+10_000*ms; now += ms {
				if ok, _ := cur.Decide("peer", "", now); ok {
					if first < 0 {
						first = (now - t0) / ms
					}
					n++
				}
			}
			if first != c.firstAdmitted || n != c.inTenS {
				t.Fatalf("first admitted at +%d ms, %d in 10 s; want +%d ms, %d", first, n, c.firstAdmitted, c.inTenS)
			}
		})
	}
}

// The controller's level and the start of a reversal hold carry over to
// a new generation, whose throttled rules get the level at once; a hold
// in progress is not restarted.
func TestStoreDynamicContinues(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1_700_000_000+int64(s), 0) }
	table := []Step{{55, 30}, {60, 40}, {65, 50}}
	s := NewStore()
	d1, _ := NewDynamic(table, 50, 30*time.Second, 20)
	r1 := mustRule(t, "gx-ccr-i", 200, 0)
	g1 := s.Attach(Generation{Profiles: []*Profile{NewProfile("p", nil, []*Rule{r1}, 100)}, Dynamic: d1, Throttled: []*Rule{r1}, Payload: "one"})
	s.Sample(62, at(0))
	s.Sample(49, at(20)) // the hold starts
	d2, _ := NewDynamic(table, 50, 30*time.Second, 20)
	r2 := mustRule(t, "gx-ccr-i", 200, 0)
	s.Attach(Generation{Profiles: []*Profile{NewProfile("p", nil, []*Rule{r2}, 100)}, Dynamic: d2, Throttled: []*Rule{r2}, Payload: "two"})
	if r2.Throttle() != 40 {
		t.Fatalf("new generation's rule throttled %d %%, want 40", r2.Throttle())
	}
	if s.Active() != "two" || s.Newest() != "two" {
		t.Fatalf("active %v, newest %v", s.Active(), s.Newest())
	}
	g1.Detach()
	if _, after, _ := s.Sample(48, at(45)); after != 40 {
		t.Fatalf("stepped back after 25 s of a 30 s hold: %d", after)
	}
	if _, after, _ := s.Sample(48, at(50)); after != 20 {
		t.Fatalf("30 s after the hold started (before the reload): %d %%, want 20", after)
	}
	if st, _ := s.Controller(); !st.ReversalSince.Equal(at(50)) {
		t.Fatalf("the next hold starts at %v", st.ReversalSince)
	}
	if r1.Throttle() != 40 {
		t.Fatal("a detached generation's rule is still driven")
	}
}

// A new table whose top throttle is below the level lowers it at once.
func TestStoreDynamicClampedToNewTable(t *testing.T) {
	s := NewStore()
	d1, _ := NewDynamic([]Step{{55, 30}, {65, 50}}, 50, time.Second, 20)
	s.Attach(Generation{Dynamic: d1})
	s.Sample(70, time.Unix(0, 0))
	d2, _ := NewDynamic([]Step{{55, 20}, {65, 30}}, 50, time.Second, 20)
	r := mustRule(t, "x", 100, 0)
	s.Attach(Generation{Dynamic: d2, Throttled: []*Rule{r}})
	if st, _ := s.Controller(); st.Throttle != 30 || r.Throttle() != 30 {
		t.Fatalf("level %d, rule %d; want 30", st.Throttle, r.Throttle())
	}
}

// A generation that detaches before the old one (a failed load) leaves
// the old settings in force: its controller, its bounds, its tables.
func TestStoreFailedLoadChangesNothing(t *testing.T) {
	s := NewStore()
	d1, _ := NewDynamic([]Step{{55, 30}, {65, 50}}, 50, time.Second, 20)
	r1 := mustRule(t, "overall", 100, 1)
	p1 := NewProfile("p", r1, nil, 64*4)
	s.Attach(Generation{Profiles: []*Profile{p1}, Dynamic: d1, Throttled: []*Rule{r1}, Payload: 1})
	s.Sample(70, time.Unix(0, 0))
	for i := range 200 {
		p1.Decide(string(rune('a'+i%26))+string(rune('a'+i/26)), "", 0)
	}
	keys := p1.Keys()
	d2, _ := NewDynamic([]Step{{55, 10}}, 50, time.Second, 20)
	r2 := mustRule(t, "overall", 100, 1)
	p2 := NewProfile("p", r2, nil, 64)
	p3 := NewProfile("q", mustRule(t, "overall", 1, 1), nil, 64)
	g2 := s.Attach(Generation{Profiles: []*Profile{p2, p3}, Dynamic: d2, Throttled: []*Rule{r2}, Payload: 2})
	if r1.Throttle() != 10 || p1.Keys() > 64 || s.Tables() != 2 {
		t.Fatalf("new settings not applied: throttle %d, %d keys, %d tables", r1.Throttle(), p1.Keys(), s.Tables())
	}
	g2.Detach()
	if s.Active() != 1 || s.Tables() != 1 {
		t.Fatalf("active %v, %d tables", s.Active(), s.Tables())
	}
	s.Sample(70, time.Unix(1, 0))
	if r1.Throttle() != 50 {
		t.Fatalf("old table not back in force: throttle %d", r1.Throttle())
	}
	for i := range 200 {
		p1.Decide(string(rune('A'+i%26))+string(rune('A'+i/26)), "", 0)
	}
	if p1.Keys() <= 64 || keys <= 64 {
		t.Fatalf("old bound not back: %d keys (%d before)", p1.Keys(), keys)
	}
}

// Without a generation that has a controller, the level is gone.
func TestStoreControllerDroppedWithLastDynamicGeneration(t *testing.T) {
	s := NewStore()
	d1, _ := NewDynamic([]Step{{55, 30}}, 50, time.Second, 20)
	g1 := s.Attach(Generation{Dynamic: d1})
	s.Sample(60, time.Unix(0, 0))
	r := mustRule(t, "x", 100, 0)
	s.Attach(Generation{Throttled: []*Rule{r}})
	if st, ok := s.Controller(); !ok || st.Throttle != 30 {
		t.Fatalf("controller while an older generation has it: %+v %v", st, ok)
	}
	if empty := g1.Detach(); empty {
		t.Fatal("store empty with one generation attached")
	}
	if _, ok := s.Controller(); ok || r.Throttle() != 0 {
		t.Fatalf("controller kept without a dynamic generation; rule %d", r.Throttle())
	}
}

// A generation in use keeps admitting while others attach and detach: a
// reload reads the live profiles' tables and must not write them (run
// under -race, which the test command does for internal/).
func TestStoreReloadBesideLiveRequests(t *testing.T) {
	s := NewStore()
	msg := []*Rule{mustRule(t, "CCR", 1e6, 1000)}
	live := NewProfile("p", mustRule(t, "overall", 1e6, 1000), msg, 100)
	s.Attach(Generation{Profiles: []*Profile{live}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			g := s.Attach(Generation{Profiles: []*Profile{
				NewProfile("p", mustRule(t, "overall", float64(1e6+i), 1000), msg, 100)}})
			g.Detach()
		}
	}()
	now := int64(time.Hour)
	for {
		select {
		case <-done:
			return
		default:
		}
		now += ms
		live.Decide("peer", "CCR", now)
	}
}
