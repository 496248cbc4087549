package gatewaysel

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// A run that ended while the query did not wait (no wait left, or the
// query's context ended at once) is read as ended, not as the deadline.
func TestAwaitRunSeesAnEndedRun(t *testing.T) {
	flight := make(chan struct{})
	close(flight)
	if why := awaitRun(context.Background(), flight, WhyDeadline, 0); why != WhyNoAnswer {
		t.Fatalf("no wait left: %v, want %v", why, WhyNoAnswer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 { // select picks either ready case
		if why := awaitRun(ctx, flight, WhyDeadline, time.Second); why != WhyNoAnswer {
			t.Fatalf("cancelled query: %v, want %v", why, WhyNoAnswer)
		}
	}
	if why := awaitRun(context.Background(), make(chan struct{}), WhyDeadline, 0); why != WhyDeadline {
		t.Fatalf("a run still going: %v, want %v", why, WhyDeadline)
	}
}

// BenchmarkSelectReports is a cached answer with reports off, with reports
// on for a location that has none (its network key looked up, not found),
// and from a location's reports: the same run gives the ratio.
func BenchmarkSelectReports(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		reports bool
		key     string
	}{{"reports_off", false, ""}, {"reports_on_none_here", true, "10.9.0.0/24"}, {"from_reports", true, "10.1.0.0/24"}} {
		b.Run(c.name, func(b *testing.B) {
			s := newSelB(b, Config{Gateways: exampleGateways(), Prober: exampleProber(), Recheck: -1, Reports: rttreports.Config{Enabled: c.reports}})
			defer s.Close()
			now := time.Now()
			if c.reports {
				for i := range 5 {
					s.Reports().Add("10.1.0.0/24", fmt.Sprint(i), rep(now, "gw1", 90*ms, "gw3", 5*ms), now)
				}
			}
			s.SelectReported(ctx, "loc", c.key)
			want := Cached
			if c.key == "10.1.0.0/24" {
				want = Reported
			}
			b.ReportAllocs()
			for b.Loop() {
				if sel := s.SelectReported(ctx, "loc", c.key); sel.Source != want {
					b.Fatalf("%v, want %v", sel.Source, want)
				}
			}
		})
	}
}

func newSelB(b *testing.B, cfg Config) *Table {
	s, err := NewTable(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// Through the selector: a location with enough reports answers from them
// (source reports, no probe run); another location is probed as before; a
// gateway the re-check finds dead is moved back in reported orders too.
func TestSelectorReported(t *testing.T) {
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Recheck: -1, Reports: rttreports.Config{Enabled: true}})
	now := time.Now()
	for i := range 3 {
		if err := s.Reports().Add("10.1.0.0/24", fmt.Sprint(i), rep(now, "gw1", 90*ms, "gw3", 5*ms), now); err != nil {
			t.Fatal(err)
		}
	}
	sel := s.SelectReported(context.Background(), "ecs:10.1.0.0/24", "10.1.0.0/24")
	if sel.Source != Reported || sel.Reporters != 3 || sel.Names()[0] != "gw3" {
		t.Fatalf("reported location: %v %d %v", sel.Source, sel.Reporters, sel.Names())
	}
	if p.calls.Load() != 0 {
		t.Fatalf("%d probes for a reported location", p.calls.Load())
	}
	other := s.SelectReported(context.Background(), "ecs:10.2.0.0/24", "10.2.0.0/24")
	if other.Source != Probed || other.Names()[0] != "gw2" {
		t.Fatalf("unreported location: %v %v", other.Source, other.Names())
	}
	delete(p.rtts, "c:1") // gw3 dies
	s.RecheckNow()
	sel = s.SelectReported(context.Background(), "ecs:10.1.0.0/24", "10.1.0.0/24")
	if got := sel.Names(); got[0] != "gw1" || got[len(got)-1] != "gw3" {
		t.Fatalf("dead reported first choice not moved back: %v", got)
	}
	// A reload keeps the reports (they are the selector's process state).
	cfg := s.Config()
	cfg.Reports.MinReporters = 2
	if _, err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if sel := s.SelectReported(context.Background(), "x", "10.1.0.0/24"); sel.Source != Reported {
		t.Fatalf("after a reload: %v", sel.Source)
	}
	s.Close()
}
