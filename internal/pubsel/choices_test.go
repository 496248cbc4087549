package pubsel

import (
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

// choicesSelector is a p2c selector comparing k members, random draws
// unless seq is given.
func choicesSelector(tr *Tracker, k int, seq ...int) *Selector[*up] {
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, Choices: k}
	if len(seq) > 0 {
		s.IntN = draws(seq...)
	}
	return s
}

// With choices all, a pick is always the available member of lowest cost,
// whatever the draws; none available, any available one outside it.
func TestChoicesAllTakesLowestCost(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(5)
	for _, x := range p {
		measure(t, tr, x.addr, 5*ms)
	}
	s := choicesSelector(tr, ChoicesAll)
	for round := range 60 {
		var fs []Flight
		best := -1
		for i, x := range p {
			k := (i*7 + round*3) % 5 // a permutation of 0..4 in flight
			fs = append(fs, inFlight(tr, x.addr, k)...)
			x.down = (i+round)%4 == 0
			if !x.down && (best < 0 || k < (best*7+round*3)%5) {
				best = i
			}
		}
		for range 5 {
			if u, _, _ := s.SelectUnpinned(p, 0); u != p[best] {
				t.Fatalf("round %d: picked %s, want the cheapest available %s", round, u.addr, p[best].addr)
			}
		}
		for _, f := range fs {
			f.Done()
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.SelectUnpinned(p, 0) }); n != 0 {
		t.Fatalf("choices all: %v allocs a pick", n)
	}
}

// With choices 3 of 5, the pick is the cheapest of the three drawn: never
// one of the two dearest, and the cheapest with the odds of being drawn
// (6 in 10), the second 3 in 10, the third 1 in 10.
func TestChoicesThreeOfFive(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(5)
	// Costs out of the members' order (a pick scans them in order): the
	// cheapest first.
	byCost := []*up{p[1], p[3], p[0], p[4], p[2]}
	for r, x := range byCost {
		measure(t, tr, x.addr, 5*ms)
		inFlight(tr, x.addr, r)
	}
	// Floyd's draws ask IntN(3), IntN(4), IntN(5): 1, 3, 4 (none taken
	// yet each time). Of 1, 3 and 4 the cheapest is 1.
	if u, _, _ := choicesSelector(tr, 3, 1, 3, 4).SelectUnpinned(p, 0); u != p[1] {
		t.Fatalf("drew 1, 3, 4: picked %s", u.addr)
	}
	// Every sequence of Floyd's three draws, each once: exactly those odds.
	exact := map[*up]int{}
	for a := range 3 {
		for b := range 4 {
			for c := range 5 {
				u, _, _ := choicesSelector(tr, 3, a, b, c).SelectUnpinned(p, 0)
				exact[u]++
			}
		}
	}
	if exact[byCost[0]] != 36 || exact[byCost[1]] != 18 || exact[byCost[2]] != 6 {
		t.Fatalf("over all 60 draws: %d, %d, %d picks of the three cheapest, want 36, 18, 6", exact[byCost[0]], exact[byCost[1]], exact[byCost[2]])
	}
	s := choicesSelector(tr, 3)
	c := map[*up]int{}
	const n = 6000
	for range n {
		u, _, _ := s.SelectUnpinned(p, 0)
		c[u]++
	}
	if c[byCost[3]]+c[byCost[4]] != 0 {
		t.Fatalf("picked one of the two dearest: %v", c)
	}
	for i, want := range []float64{0.6, 0.3, 0.1} {
		if got := float64(c[byCost[i]]) / n; got < want-0.04 || got > want+0.04 {
			t.Fatalf("cost rank %d: share %.3f, want %.1f", i+1, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.SelectUnpinned(p, 0) }); n != 0 {
		t.Fatalf("choices 3: %v allocs a pick", n)
	}
}

// Choices 2 is the default: the same draws make the same picks.
func TestChoicesTwoIsDefault(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(5)
	for i, x := range p {
		measure(t, tr, x.addr, time.Duration(5+i%3)*ms)
		inFlight(tr, x.addr, (i*3)%5)
	}
	seq := []int{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9}
	def, two := choicesSelector(tr, 0, seq...), choicesSelector(tr, 2, seq...)
	for i := range 40 {
		a, _, _ := def.SelectUnpinned(p, 0)
		b, _, _ := two.SelectUnpinned(p, 0)
		if a != b {
			t.Fatalf("pick %d: default %s, choices 2 %s", i, a.addr, b.addr)
		}
	}
}

// With more than two compared, a member without a fresh load report takes
// the mean factor of those with one (A58's rule).
func TestChoicesMeanFactor(t *testing.T) {
	const sec = int64(time.Second)
	tr := newTracker(t, Config{ORCA: true, ORCAPeriods: orca.Periods{Blackout: 10 * time.Second, Expiration: time.Minute}})
	p := pubs(3)
	for _, x := range p {
		measure(t, tr, x.addr, 5*ms)
	}
	report := func(addr, v string, now int64) {
		f := tr.Begin(addr)
		defer f.Done()
		if why := tr.ReportLoad(f, v, false, now); why != orca.ReasonOK {
			t.Fatalf("%s: %v", v, why)
		}
	}
	t0, now := 1000*sec, 1011*sec
	for _, at := range []int64{t0, now} {
		report(p[0].addr, "TEXT cpu_utilization=0.95", at) // factor 20
		report(p[1].addr, "TEXT cpu_utilization=0", at)    // factor 1
	}
	// p[2] never reports: its factor is the mean, 10.5.
	s := choicesSelector(tr, ChoicesAll)
	// 5 ms × 20 = 100, 5 × 1 = 5, 5 × 10.5 = 52.5: the one at 1.
	if u, _, _ := s.SelectUnpinned(p, now); u != p[1] {
		t.Fatalf("idle: picked %s, want publisher 1 (cost 5 against 52.5 and 100)", u.addr)
	}
	// 12 in flight on 1 (65): the unreported one at the mean (52.5), not
	// the busy one (100).
	var fs []Flight
	defer func() {
		for _, f := range fs {
			f.Done()
		}
	}()
	fs = append(fs, inFlight(tr, p[1].addr, 12)...)
	if u, _, _ := s.SelectUnpinned(p, now); u != p[2] {
		t.Fatalf("1 with 12 in flight: picked %s, want the unreported 2 (52.5 against 65 and 100)", u.addr)
	}
	// At factor 1 instead of the mean, 2 would have cost 5 and won while 1
	// was idle; at the mean, 8 in flight on it (9 × 52.5) loses to 1 (65).
	fs = append(fs, inFlight(tr, p[2].addr, 8)...)
	if u, _, _ := s.SelectUnpinned(p, now); u != p[1] {
		t.Fatalf("2 with 8 in flight: picked %s, want 1 (65 against 472.5 and 100)", u.addr)
	}
}

// Beyond 64 members the k are drawn member by member (selection
// sampling): 68 of 70 compared always hold one of the three cheapest, and
// the cheapest 68 times in 70.
func TestChoicesManyMembers(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(70)
	rank := map[*up]int{}
	for i, x := range p {
		rank[x] = len(p) - 1 - i                                                 // the last member cheapest: sampling goes in order
		measure(t, tr, x.addr, 5*ms+time.Duration(rank[x])*100*time.Microsecond) // all in the lowest bucket
	}
	s := choicesSelector(tr, 68)
	const n = 2000
	first := 0
	for range n {
		u, _, _ := s.SelectUnpinned(p, 0)
		if rank[u] > 2 {
			t.Fatalf("68 of 70 compared: picked rank %d", rank[u])
		}
		if rank[u] == 0 {
			first++
		}
	}
	if f := float64(first) / n; f < 0.95 {
		t.Fatalf("the cheapest got %.3f of picks, want about 68/70", f)
	}
}
