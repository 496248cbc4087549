package placement

import (
	"fmt"
	"slices"
	"testing"
)

// Recent keeps at most max names, forgetting the least recently touched.
func TestRecentIsBounded(t *testing.T) {
	r := NewRecent(3)
	for _, n := range []string{"a", "b", "c", "a", "d", "e"} {
		r.Touch(n)
	}
	if got := r.Names(); !slices.Equal(got, []string{"e", "d", "a"}) {
		t.Fatalf("names %v, want [e d a]", got)
	}
	for i := range 10000 {
		r.Touch(fmt.Sprint("client-chosen-", i))
	}
	if r.Len() != 3 {
		t.Fatalf("%d names held, want at most 3", r.Len())
	}
}

// A tally keeps the most recently counted names only.
func TestTallyIsBounded(t *testing.T) {
	ta := NewTally(3)
	for _, name := range []string{"a", "b", "a", "c", "d", "a"} {
		ta.Add(name)
	}
	if got := ta.Counts(); len(got) != 3 || got["a"] != 3 || got["b"] != 0 || got["d"] != 1 {
		t.Fatalf("tally %v", got)
	}
}
