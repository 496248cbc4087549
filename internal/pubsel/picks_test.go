package pubsel

import (
	"maps"
	"testing"
	"time"
)

// pickCounts is p's counts by (publisher, bucket label, decision).
func pickCounts(p *Picks) map[PickCount]uint64 {
	out := map[PickCount]uint64{}
	for _, c := range p.Counts() {
		if c.Created.IsZero() {
			panic("a count without its creation time")
		}
		out[PickCount{Addr: c.Addr, Label: c.Label, Sticky: c.Sticky}] = c.N
	}
	return out
}

// The selectors of successive config generations share one Picks: it
// counts their decisions by publisher, bucket label and decision, and
// keeps every count through a new bucket width (the same bucket index
// under another label), the removal of a publisher whose id another one
// then takes, and that publisher's return.
func TestPicksAcrossGenerations(t *testing.T) {
	st, err := NewState(settings(32 * ms))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	picks := new(Picks)
	a, b, c := &up{addr: "a:443"}, &up{addr: "b:443"}, &up{addr: "c:443"}
	selector := func(owner string, width time.Duration) (*Lease, *Selector[*up]) {
		l, err := st.Lease(owner, settings(width))
		if err != nil {
			t.Fatal(err)
		}
		return l, &Selector[*up]{Tracker: st.Tracker(), Holder: l.Holder(), Host: upHost{}, Sticky: st.Table(), Picks: picks}
	}
	pick := func(s *Selector[*up], pool []*up, user string, n int, want *up) {
		t.Helper()
		for range n {
			var u *up
			if user == "" {
				u, _, _ = s.SelectUnpinned(pool, st.Now())
			} else {
				u, _, _ = s.Select(pool, user, "app", st.Now())
			}
			if u != want {
				t.Fatalf("picked %v, want %s", u, want.addr)
			}
		}
	}
	// check compares the counts with want, and the totals with want's.
	check := func(when string, want map[PickCount]uint64) {
		t.Helper()
		if got := pickCounts(picks); !maps.Equal(got, want) {
			t.Fatalf("%s: counts %v, want %v", when, got, want)
		}
		wantTotals, wantSticky := map[string]uint64{}, uint64(0)
		for k, n := range want {
			wantTotals[k.Addr] += n
			if k.Sticky {
				wantSticky += n
			}
		}
		if totals, sticky := picks.Totals(); !maps.Equal(totals, wantTotals) || sticky != wantSticky {
			t.Fatalf("%s: totals %v, %d sticky; want %v, %d", when, totals, sticky, wantTotals, wantSticky)
		}
	}
	ensure := func(l *Lease, pool ...*up) { // as the adapter holds a config's upstreams
		t.Helper()
		for _, u := range pool {
			if _, err := l.Ensure(u.addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	key := func(u *up, label string, sticky bool) PickCount {
		return PickCount{Addr: u.addr, Label: label, Sticky: sticky}
	}

	gen1, sel1 := selector("gen1", 32*ms)
	first, _, _ := sel1.SelectUnpinned([]*up{a, b}, 0) // registers the pool: both unmeasured
	measure(t, st.Tracker(), a.addr, 5*ms)
	measure(t, st.Tracker(), b.addr, 40*ms)
	pick(sel1, []*up{a, b}, "", 10, a)
	pick(sel1, []*up{a, b}, "alice", 5, a) // a new pick, pinned, then 4 sticky ones
	want := map[PickCount]uint64{key(first, "unmeasured", false): 1, key(a, "[0,32)", false): 11, key(a, "[0,32)", true): 4}
	check("generation 1", want)

	// A reload with a new width: a stays in bucket 0, now labelled [0,16).
	gen2, sel2 := selector("gen2", 16*ms)
	ensure(gen2, a, b)
	gen1.Release()
	pick(sel2, []*up{a, b}, "", 3, a)
	pick(sel2, []*up{a, b}, "alice", 2, a)
	want[key(a, "[0,16)", false)] = 3
	want[key(a, "[0,16)", true)] = 2
	check("generation 2", want)

	// a leaves the config: its target goes, and c, added next, takes its
	// id. a's counts stay; c's picks are c's.
	idA := st.Tracker().targets[a.addr].id
	gen3, sel3 := selector("gen3", 16*ms)
	ensure(gen3, b)
	gen2.Release()
	if _, ok := statusOf(st.Tracker(), a.addr); ok {
		t.Fatal("a still tracked after its last generation went")
	}
	sel3.SelectUnpinned([]*up{b, c}, st.Now()) // registers c, unmeasured: b is picked
	if s, _ := statusOf(st.Tracker(), c.addr); s.ID != idA {
		t.Fatalf("c has id %d, a had %d: the test needs the id reused", s.ID, idA)
	}
	measure(t, st.Tracker(), c.addr, 3*ms)
	pick(sel3, []*up{b, c}, "", 4, c)
	want[key(b, "[32,64)", false)] = 1
	want[key(c, "[0,16)", false)] = 4
	check("a removed", want)

	// a comes back: its counts go on.
	gen4, sel4 := selector("gen4", 16*ms)
	defer gen4.Release()
	ensure(gen4, a)
	measure(t, st.Tracker(), a.addr, 2*ms)
	pick(sel4, []*up{a}, "", 2, a)
	gen3.Release()
	if got := pickCounts(picks)[key(a, "[0,16)", false)]; got != 5 {
		t.Fatalf("a back: %d new picks in [0,16), want 3 + 2", got)
	}

	picks.Count(nil, true) // an unprobed upstream: not counted
	if _, sticky := picks.Totals(); sticky != 6 {
		t.Fatalf("%d sticky decisions, want 6", sticky)
	}
}
