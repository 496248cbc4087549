package gatewaysel

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// A reported location's first choice stays first for the hold while the
// reports move another gateway ahead (the rest follows the reports), until
// the hold ends or the re-check finds it dead; hold off follows the reports
// at once.
func TestHoldKeepsFirstChoice(t *testing.T) {
	for _, hold := range []time.Duration{0, -1} {
		p := exampleProber()
		s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Recheck: -1, Hold: hold, Reports: rttreports.Config{Enabled: true}})
		now := time.Unix(1_000_000, 0)
		s.now = func() time.Time { return now }
		report := func(kv ...any) {
			for i := range 3 {
				if err := s.Reports().Add("10.1.0.0/24", fmt.Sprint(i), rep(now, kv...), now); err != nil {
					t.Fatal(err)
				}
			}
		}
		sel := func() ([]string, time.Time) {
			sel := s.SelectReported(context.Background(), "ecs:10.1.0.0/24", "10.1.0.0/24")
			return sel.Names(), sel.HoldUntil
		}
		report("gw1", 90*ms, "gw3", 5*ms, "gw2", 50*ms)
		start := now
		got, until := sel()
		if got[0] != "gw3" {
			t.Fatalf("first: %v", got)
		}
		if hold < 0 {
			if !until.IsZero() {
				t.Fatalf("hold off: until %v", until)
			}
		} else if !until.Equal(start.Add(DefaultHold)) {
			t.Fatalf("until %v, want %v", until, start.Add(DefaultHold))
		}
		now = now.Add(time.Hour)
		report("gw1", 2*ms, "gw3", 5*ms, "gw2", 1*ms) // gw2, then gw1, now closer
		got, until = sel()
		want := []string{"gw3", "gw2", "gw1", "gw4"}
		if hold < 0 {
			want = []string{"gw2", "gw1", "gw3", "gw4"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("hold %v, closer gateways reported: %v, want %v", hold, got, want)
		}
		if hold < 0 {
			continue
		}
		if !until.Equal(start.Add(DefaultHold)) {
			t.Fatalf("the hold moved: %v", until)
		}
		// The re-check finds gw3 dead: released, gw2 first, no hold.
		delete(p.rtts, "c:1")
		s.RecheckNow()
		if got, until = sel(); got[0] != "gw2" || !until.IsZero() {
			t.Fatalf("held first dead: %v until %v", got, until)
		}
		// gw3 back within the hold: first again, as before it failed.
		p.rtts["c:1"] = 5 * ms
		s.RecheckNow()
		if got, until = sel(); got[0] != "gw3" || !until.Equal(start.Add(DefaultHold)) {
			t.Fatalf("gw3 back: %v until %v", got, until)
		}
		// The hold over: the reports' first, held anew.
		now = start.Add(DefaultHold)
		report("gw1", 2*ms, "gw3", 5*ms, "gw2", 1*ms)
		if got, until = sel(); got[0] != "gw2" || !until.Equal(now.Add(DefaultHold)) {
			t.Fatalf("hold over: %v until %v", got, until)
		}
		s.Close()
	}
}

// A probed location whose result expires within the hold keeps its first
// choice over a closer one: the new result carries the hold, and so do the
// cache file (a restart) and the shared store's value, validated on read.
func TestHoldCarriedWithResult(t *testing.T) {
	p := exampleProber()
	now := time.Unix(1_000_000, 0)
	cfg := Config{Gateways: exampleGateways(), Prober: p, Recheck: -1, CacheTTL: time.Hour}
	s := newSel(t, cfg)
	s.now = func() time.Time { return now }
	first := func(s *Table) string {
		sel := s.Select(context.Background(), "loc")
		return sel.Gateways[sel.Order[0]].Name
	}
	if got := first(s); got != "gw2" {
		t.Fatalf("first run: %s", got)
	}
	p.rtts["a:1"] = ms // gw1 closer now
	now = now.Add(2 * time.Hour)
	if got := first(s); got != "gw2" {
		t.Fatalf("second run within the hold: %s, want gw2", got)
	}
	s.mu.Lock()
	res := s.entries["loc"].res
	s.mu.Unlock()
	if res.Held != "gw2" || !res.HoldUntil.Equal(time.Unix(1_000_000, 0).Add(DefaultHold)) {
		t.Fatalf("result carries %q until %v", res.Held, res.HoldUntil)
	}
	path := filepath.Join(t.TempDir(), "cache.json")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := newSel(t, cfg)
	s2.now = func() time.Time { return now }
	if n, err := s2.Load(path); n != 1 || err != nil {
		t.Fatalf("load: %d %v", n, err)
	}
	if got := first(s2); got != "gw2" {
		t.Fatalf("after a restart: %s, want the held gw2", got)
	}
	s2.Close()

	// The store's value: the hold travels with it, and is checked.
	s3 := newSel(t, cfg)
	s3.now = func() time.Time { return now }
	for _, c := range []struct {
		held  string
		until time.Time
		want  string
	}{
		{"gw2", res.HoldUntil, "gw2"},
		{"gw9", res.HoldUntil, "gw1"},                        // not a configured gateway
		{"gw2", now.Add(DefaultHold + 2*time.Minute), "gw1"}, // beyond the hold from now
		{"gw2", now.Add(-time.Second), "gw1"},                // over
	} {
		r := *res
		r.Held, r.HoldUntil = c.held, c.until
		data, err := encodeStored(&r, &s3.cfg)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := decodeStored(data, &s3.cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		e := &entry{res: dec, epoch: s3.epoch}
		s3.mu.Lock()
		s3.adoptHold(e, dec, now)
		got, _ := s3.hold(e, dec, now, true, false)
		s3.mu.Unlock()
		if n := got.Gateways[got.Order[0]].Name; n != c.want {
			t.Fatalf("stored hold %s until %v: first %s, want %s", c.held, c.until, n, c.want)
		}
	}
	s3.Close()
}

// Replicas share the hold through the store: a's new result (its old one
// expired within the hold) carries the hold, and b, reading it, answers
// the held first choice until the same time, not the closer gateway.
func TestHoldSharedThroughStore(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	pa, pb := exampleProber(), exampleProber()
	ttl := func(c *Config) { c.CacheTTL = time.Hour }
	a, b := replica(t, store, pa, ev, ttl), replica(t, store, pb, ev, ttl)
	start := time.Unix(1_000_000, 0)
	now := start
	a.now = func() time.Time { return now }
	b.now = func() time.Time { return now }
	if sel := a.Select(context.Background(), "loc"); sel.Gateways[sel.Order[0]].Name != "gw2" {
		t.Fatalf("a's first run: %v", sel.Names())
	}
	now = start.Add(2 * time.Hour) // a's result expired, the hold goes on
	pa.rtts["a:1"], pb.rtts["a:1"] = ms, ms
	if sel := a.Select(context.Background(), "loc"); sel.Source != Probed || sel.Gateways[sel.Order[0]].Name != "gw2" {
		t.Fatalf("a's second run: %v %v", sel.Source, sel.Names())
	}
	sel := b.Select(context.Background(), "loc")
	if got := sel.Names(); sel.Source != FromReplica || got[0] != "gw2" || got[1] != "gw1" || !sel.HoldUntil.Equal(start.Add(DefaultHold)) {
		t.Fatalf("b: %v %v until %v, want the stored result with gw2 held until %v", sel.Source, got, sel.HoldUntil, start.Add(DefaultHold))
	}
	if pb.calls.Load() != 0 {
		t.Fatalf("b probed %d times", pb.calls.Load())
	}
}
