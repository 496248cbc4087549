package pubsel

import (
	"context"
	"testing"
	"time"
)

func settings(width time.Duration) Settings {
	return Settings{Tracker: Config{BucketWidth: width, Hysteresis: DefaultHysteresis, Interval: time.Hour,
		Timeout: time.Hour, Prober: silentProber{}},
		Sticky: true, StickyTTL: time.Hour, StickyMaxEntries: 1000}
}

// silentProber never completes a probe while the test runs, so the only
// measurements are the ones the test injects (a real probe of a made-up
// name fails when the machine gets to it, and would race with them).
type silentProber struct{}

func (silentProber) Probe(ctx context.Context, _ string) (time.Duration, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

// A new generation adopts the state: pins and measurements stay, its
// settings apply; the old generation's release drops only what it alone
// held. A generation that fails to load (released while the previous one
// is live) puts the previous settings back.
func TestLeaseAdoptsAndReleases(t *testing.T) {
	st, err := NewState(settings(32 * ms))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gen1, _ := st.Lease("gen1", settings(32*ms))
	p := pubs(4)
	sel1 := &Selector[*up]{Tracker: st.Tracker(), Holder: gen1.Holder(), Host: upHost{}, Sticky: st.Table()}
	sel1.Select(p, "", "", 0) // registers the pool
	for i, d := range []time.Duration{5 * ms, 6 * ms, 20 * ms, 7 * ms} {
		measure(t, st.Tracker(), p[i].addr, d)
	}
	pinned := map[string]*up{}
	for i := range 100 {
		u, _, _ := sel1.Select(p, "user", string(rune('a'+i)), st.Now())
		pinned[string(rune('a'+i))] = u
	}
	if st.Table().Len() != 100 {
		t.Fatalf("%d pins", st.Table().Len())
	}

	// Generation 2: bucket width 16 ms, publisher 4 removed, 5 added.
	gen2, err := st.Lease("gen2", settings(16*ms))
	if err != nil {
		t.Fatal(err)
	}
	pool2 := append(p[:3:3], &up{addr: "publisher5:443"})
	sel2 := &Selector[*up]{Tracker: st.Tracker(), Holder: gen2.Holder(), Host: upHost{}, Sticky: st.Table()}
	sel2.Select(pool2, "", "", 0)
	if s, _ := statusOf(st.Tracker(), p[2].addr); s.Label != "[16,32)" || s.Rounds != 1 {
		t.Fatalf("publisher 3 after the new width: %+v", s)
	}
	gen1.Release()
	if _, ok := statusOf(st.Tracker(), p[3].addr); ok {
		t.Fatal("publisher 4 still tracked after its last generation went")
	}
	if st.Settings().Tracker.BucketWidth != 16*ms || st.Leases() != 1 {
		t.Fatalf("settings %v, %d leases", st.Settings().Tracker.BucketWidth, st.Leases())
	}
	kept, moved := 0, 0
	for app, was := range pinned {
		u, d, _ := sel2.Select(pool2, "user", app, st.Now())
		switch {
		case was == p[3]:
			if d.Sticky || u == p[3] {
				t.Fatalf("pair %s still pinned to the removed publisher", app)
			}
			moved++
		case u != was || !d.Sticky:
			t.Fatalf("pair %s moved from %s to %s", app, was.addr, u.addr)
		default:
			kept++
		}
	}
	if kept < 50 || moved < 10 {
		t.Fatalf("kept %d, moved %d: the test needs both", kept, moved)
	}

	// A generation that fails to load: its settings go with it.
	gen3, _ := st.Lease("gen3", settings(64*ms))
	if st.Settings().Tracker.BucketWidth != 64*ms {
		t.Fatal("newest settings not in force")
	}
	gen3.Release()
	if w := st.Settings().Tracker.BucketWidth; w != 16*ms {
		t.Fatalf("after the failed generation: width %v", w)
	}
	if s, _ := statusOf(st.Tracker(), p[2].addr); s.Label != "[16,32)" {
		t.Fatalf("bucket not restored: %+v", s)
	}

	// One generation using one name twice must agree on the settings.
	if _, err := st.Lease("gen2", settings(8*ms)); err != ErrConflict {
		t.Fatalf("conflicting lease: %v", err)
	}
	if l, err := st.Lease("gen2", settings(16*ms)); err != nil {
		t.Fatal(err)
	} else {
		l.Release()
	}

	// Sticky off empties the table.
	off := settings(16 * ms)
	off.Sticky = false
	gen4, _ := st.Lease("gen4", off)
	if st.Table().Len() != 0 {
		t.Fatal("sticky off kept the pins")
	}
	gen4.Release()
	gen2.Release()
}
