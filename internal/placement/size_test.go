package placement

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// A size table sizes a tenant's partitions by its users, as Foxpass sizes a
// new customer's (these steps are an example, not Foxpass' numbers): each
// step holds from its size up to the next, and none holds below the first.
func TestSizeTable(t *testing.T) {
	table, err := ParseSizeTable([]string{"0:1", "1000:2", "10000:4"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		size int64
		k    int
	}{{0, 1}, {1, 1}, {999, 1}, {1000, 2}, {9999, 2}, {10000, 4}, {MaxSize, 4}} {
		if k, ok := table.Partitions(c.size); !ok || k != c.k {
			t.Errorf("size %d: %d, %v; want %d", c.size, k, ok, c.k)
		}
	}
	high, _ := ParseSizeTable([]string{"50:2"})
	if k, ok := high.Partitions(49); ok {
		t.Errorf("below the first step: %d, want none", k)
	}
	for _, bad := range [][]string{{}, {"1000"}, {"a:1"}, {"0:0"}, {"-1:1"}, {"0:1", "0:2"}, {"10:1", "5:2"},
		{"0:3", "10:2"}, {"+5:1"}, {"0:1x"}, {fmt.Sprintf("%d:1", MaxSize+1)}} {
		if _, err := ParseSizeTable(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseSizes(t *testing.T) {
	in := "# tenant users\nacme 12000\n\nglobex 40 # small\nbad\nx y z\nneg -3\nhuge 99999999999999999999\n" +
		"plus +4\n" + strings.Repeat("n", 257) + " 1\nctl\x01 3\n"
	s, err := ParseSizes(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Sizes) != 2 || s.Sizes["acme"] != 12000 || s.Sizes["globex"] != 40 {
		t.Errorf("sizes %v", s.Sizes)
	}
	if s.Rejected != 7 || !strings.HasPrefix(s.Problems[0], "line 5:") {
		t.Errorf("rejected %d: %q", s.Rejected, s.Problems)
	}
	var b strings.Builder
	for i := range MaxSizedTenants + 5 {
		fmt.Fprintf(&b, "t%d %d\n", i, i)
	}
	s, err = ParseSizes(strings.NewReader(b.String()))
	if err != nil || len(s.Sizes) != MaxSizedTenants || s.Rejected != 5 || len(s.Problems) != 5 {
		t.Errorf("bound: %d kept, %d rejected, %v", len(s.Sizes), s.Rejected, err)
	}
	if _, err := ParseSizes(strings.NewReader(strings.Repeat("#", MaxSizesBytes+1))); err == nil {
		t.Error("an oversized file was read")
	}
}

// The base is run time, else config, else size, else default; auto grows
// from the base and shrinks back to it.
func TestSizeSetsBase(t *testing.T) {
	p := autoPlacer(t, 6, 2, &Auto{TargetPerNode: 2, CoolDown: time.Second}, 0)
	table, _ := ParseSizeTable([]string{"0:1", "1000:2", "10000:4"})
	if c := p.ReplaceSizes(map[string]int64{"big": 20000, "small": 10, "mid": 1000, "conf": 20000}); c != nil {
		t.Errorf("sizes without a table changed %v", c)
	}
	changed := p.SetSizeTable(table)
	if !slices.Equal(changed, []string{"big", "conf", "small"}) { // mid: 2 by size, as by default
		t.Errorf("changed %v", changed)
	}
	if err := p.Configure(2, map[string]int{"conf": 3}); err != nil {
		t.Fatal(err)
	}
	p.SetPartitions("mid", 5)
	for tenant, want := range map[string]int{"big": 4, "small": 1, "mid": 5, "conf": 3, "unsized": 2} {
		if got := len(p.Place(tenant)); got != want {
			t.Errorf("%s: %d nodes, want %d", tenant, got, want)
		}
	}
	if e := p.Explain("big", time.Now()); e.Source != SourceSize || e.Partitions != 4 {
		t.Errorf("explain big: %s %d", e.Source, e.Partitions)
	}

	// small grows past its base by load, then a size lowered below the
	// grown count leaves it grown until the cool-downs take it down.
	now := time.Now()
	var leases []*Lease
	for range 5 { // one by one: the 3rd grows 1 → 2, the 5th 2 → 3
		leases = append(leases, arrive(t, p, "small", 1, true, now)...)
	}
	if k := len(p.Place("small")); k != 3 {
		t.Fatalf("small grown to %d, want 3", k)
	}
	if c := p.ReplaceSizes(map[string]int64{"big": 20000, "small": 20000}); !slices.Contains(c, "small") {
		t.Errorf("raising small: changed %v", c)
	}
	if k := len(p.Place("small")); k != 4 {
		t.Errorf("small raised by size to %d, want 4 at once", k)
	}
	p.ReplaceSizes(map[string]int64{"big": 20000, "small": 10})
	if k := len(p.Place("small")); k != 3 {
		t.Errorf("small after lowering its size: %d, want its grown 3", k)
	}
	for _, l := range leases {
		l.Release(now)
	}
	for i := range 8 {
		p.Tick(now.Add(time.Duration(i) * 1100 * time.Millisecond))
	}
	if k := len(p.Place("small")); k != 1 {
		t.Errorf("small idle after cool-downs: %d, want its base 1", k)
	}
	if c := p.SetSizeTable(nil); !slices.Contains(c, "big") || len(p.Place("big")) != 2 {
		t.Errorf("sizes off: changed %v, big on %d nodes", c, len(p.Place("big")))
	}
}

// Whatever a sizes file holds, what is kept is within the bounds and every
// line is either kept or counted as rejected.
func FuzzParseSizes(f *testing.F) {
	f.Add("acme 12000\nglobex 40 # small\n")
	f.Add("bad\nx y z\nneg -3\n+4 5\n\xff 1\n")
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSizes(strings.NewReader(in))
		if err != nil {
			return
		}
		entries := 0
		for _, line := range strings.Split(in, "\n") {
			text, _, _ := strings.Cut(line, "#")
			if len(strings.Fields(text)) > 0 {
				entries++
			}
		}
		if len(s.Sizes) > MaxSizedTenants || len(s.Sizes)+s.Rejected > entries || len(s.Problems) > maxProblems {
			t.Fatalf("%d kept, %d rejected of %d entries", len(s.Sizes), s.Rejected, entries)
		}
		for tenant, n := range s.Sizes {
			if n < 0 || n > MaxSize || checkTenantName(tenant) != nil {
				t.Fatalf("kept %q = %d", tenant, n)
			}
		}
	})
}
