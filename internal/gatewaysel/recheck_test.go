package gatewaysel

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// A cached first choice that dies is found by one probe per interval and
// moved behind the gateways not found dead, without a probe run; a later
// re-check restores it.
func TestRecheckDemotesDeadFirstChoice(t *testing.T) {
	for _, omit := range []bool{false, true} {
		p := exampleProber()
		gws := exampleGateways()
		gws[1].Backups = []string{"gw4"} // gw2 (132 ms) first, then its backup gw4
		s := newSel(t, Config{Gateways: gws, Prober: p, OmitUnmeasured: omit})
		for i := range 10 {
			s.Select(context.Background(), fmt.Sprint("loc", i))
		}
		calls := p.calls.Load()
		order := func() []string {
			sel := s.Select(context.Background(), "loc3")
			if sel.Source != Cached {
				t.Fatalf("source %v: the re-check must not start a probe run", sel.Source)
			}
			return sel.Names()
		}
		s.RecheckNow()
		if p.calls.Load() != calls+1 || !slices.Equal(order(), []string{"gw2", "gw4", "gw1", "gw3"}) {
			t.Fatalf("healthy: %d re-check probes for 10 locations (want 1), order %v", p.calls.Load()-calls, order())
		}
		p.rtts["b:1"] = 0 // gw2 dies
		s.RecheckNow()
		want := []string{"gw4", "gw1", "gw3", "gw2"}
		if omit {
			want = want[:3]
		}
		if got := order(); !slices.Equal(got, want) {
			t.Fatalf("omit=%v, gw2 dead: %v, want %v", omit, got, want)
		}
		if sel := s.Select(context.Background(), "loc3"); sel.Dead == nil || sel.Dead[1] != "other" {
			t.Fatalf("dead reason not kept: %q", sel.Dead)
		}
		// The next re-check probes gw2 (stored first) and gw4 (answered first).
		calls = p.calls.Load()
		p.rtts["b:1"] = 132 * ms
		s.RecheckNow()
		if p.calls.Load() != calls+2 || !slices.Equal(order(), []string{"gw2", "gw4", "gw1", "gw3"}) {
			t.Fatalf("gw2 back: %d probes, %v", p.calls.Load()-calls, order())
		}
	}
}

// Every gateway dead: the order stays as it was (an answer needs one).
func TestRecheckAllDeadKeepsOrder(t *testing.T) {
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways()[1:2], Prober: p, OmitUnmeasured: true})
	s.Select(context.Background(), "loc")
	p.rtts["b:1"] = 0
	s.RecheckNow()
	if sel := s.Select(context.Background(), "loc"); len(sel.Order) != 1 {
		t.Fatalf("order %v", sel.Order)
	}
}

// What a query learns when every probe fails fast: no deadline story, the
// run's reasons, then the retry wait.
func TestSelectionSaysWhatHappened(t *testing.T) {
	p := &fakeProber{rtts: map[string]time.Duration{}}
	now := time.Unix(1_000_000, 0)
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Retry: time.Minute})
	s.now = func() time.Time { return now }
	sel := s.Select(context.Background(), "loc")
	if sel.Source != Configured || sel.Why != WhyNoAnswer || sel.Failed == nil || sel.Failed.Reasons[0] != ReasonOther || !sel.RetryAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("first: %+v", sel)
	}
	if sel := s.Select(context.Background(), "loc"); sel.Why != WhyRetryWait || sel.Failed == nil {
		t.Fatalf("second: %+v", sel)
	}
	// With an earlier result: the previous selection, and why.
	p.rtts = exampleProber().rtts
	now = now.Add(2 * time.Minute)
	s.Select(context.Background(), "loc")
	now = now.Add(DefaultCacheTTL)
	p.rtts = map[string]time.Duration{}
	if sel := s.Select(context.Background(), "loc"); sel.Source != Previous || sel.Why != WhyNoAnswer || sel.Gateways[sel.Order[0]].Name != "gw2" {
		t.Fatalf("with a previous result: %+v", sel)
	}
}
