package ratelimit

import (
	"sync"
	"testing"
)

// tallies returns the store's tallies as "profile/type" → counts.
func tallies(s *Store) map[string][3]uint64 {
	out := map[string][3]uint64{}
	for _, t := range s.Tallies() {
		out[t.Profile+"/"+t.Type] = t.Counts()
	}
	return out
}

func wantTallies(t *testing.T, s *Store, want map[string][3]uint64) {
	t.Helper()
	got := tallies(s)
	if len(got) != len(want) {
		t.Fatalf("tallies %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("tally %s %v, want %v (all: %v)", k, got[k], w, got)
		}
	}
}

// A profile counts by message index: 0 the other types, i+1 the i-th
// message rule. A reload continues the counts of the (profile, type)
// pairs it keeps, whatever their new index; a type or profile it removes
// keeps its counts, and so does the store once every generation is gone.
func TestTalliesOutliveGenerations(t *testing.T) {
	s := NewStore()
	old := NewProfile("p", mustRule(t, "overall", 10, 5), []*Rule{mustRule(t, "a", 1, 1), mustRule(t, "b", 1, 1)}, 100)
	gone := NewProfile("q", mustRule(t, "overall", 10, 5), nil, 100)
	g1 := s.Attach(Generation{Profiles: []*Profile{old, gone}})
	old.Count(0, Admitted)
	old.Count(1, Rejected)
	old.Count(2, Dropped)
	old.Count(2, Dropped)
	gone.Count(0, Rejected)
	wantTallies(t, s, map[string][3]uint64{"p/other": {1, 0, 0}, "p/a": {0, 1, 0}, "p/b": {0, 0, 2}, "q/other": {0, 1, 0}})

	cur := NewProfile("p", nil, []*Rule{mustRule(t, "c", 1, 1), mustRule(t, "b", 1, 1)}, 100)
	g2 := s.Attach(Generation{Profiles: []*Profile{cur}})
	g1.Detach()
	cur.Count(0, Admitted)
	cur.Count(1, Admitted)
	cur.Count(2, Dropped)
	old.Count(1, Admitted) // a request the old generation still serves
	want := map[string][3]uint64{"p/other": {2, 0, 0}, "p/a": {1, 1, 0}, "p/b": {0, 0, 3}, "p/c": {1, 0, 0}, "q/other": {0, 1, 0}}
	wantTallies(t, s, want)
	g2.Detach()
	wantTallies(t, s, want)
}

// A message type named like the other types shares their tally, as it
// shares their metric series.
func TestTallyTypeNamedOther(t *testing.T) {
	s := NewStore()
	p := NewProfile("p", nil, []*Rule{mustRule(t, OtherType, 1, 1)}, 100)
	s.Attach(Generation{Profiles: []*Profile{p}})
	p.Count(0, Admitted)
	p.Count(1, Admitted)
	wantTallies(t, s, map[string][3]uint64{"p/other": {2, 0, 0}})
}

// Counts from many goroutines at once add up.
func TestTallyConcurrent(t *testing.T) {
	p := NewProfile("p", mustRule(t, "overall", 10, 5), nil, 100)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 3000 {
				p.Count(0, Verdict(i%3))
			}
		})
	}
	wg.Wait()
	if got := p.tallies[0].Counts(); got != [3]uint64{8000, 8000, 8000} {
		t.Fatalf("counts %v, want 8000 each", got)
	}
}

// BenchmarkCount is the counting of one decision (Profile.Count).
func BenchmarkCount(b *testing.B) {
	r, _ := NewRule("a", 1, 1)
	p := NewProfile("p", nil, []*Rule{r}, 100)
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			p.Count(1, Admitted)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p.Count(1, Admitted)
			}
		})
	})
}
