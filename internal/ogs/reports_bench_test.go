package ogs

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

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
			s := newSelB(b, Config{Gateways: exampleGateways(), Prober: exampleProber(), Recheck: -1, Reports: ReportConfig{Enabled: c.reports}})
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

// BenchmarkReportAdd is one accepted report (4 gateways) into a location
// with 64 reporters, and one aggregation after it (the next query's).
func BenchmarkReportAdd(b *testing.B) {
	r := NewReports()
	r.Configure(ReportConfig{Enabled: true}, exampleGateways(), false)
	now := time.Now()
	i := 0
	for b.Loop() {
		r.Add("10.1.0.0/24", fmt.Sprint(i%64), rep(now, "gw1", 90*ms, "gw2", 20*ms, "gw3", 5*ms, "gw4", 40*ms), now)
		r.Order("10.1.0.0/24", now)
		i++
	}
}

// TestReportMemoryPerLocation measures the heap a location with reports
// costs: 3 and 64 reporters of 4 gateways each, aggregated. It asserts
// only a loose bound (10x the figure measured when written) and logs the
// figure for BENCHMARKS.md.
func TestReportMemoryPerLocation(t *testing.T) {
	for _, reporters := range []int{3, 64} {
		const n = 2000
		r := NewReports()
		r.Configure(ReportConfig{Enabled: true, MaxLocations: n}, exampleGateways(), false)
		now := time.Now()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for l := range n {
			loc := fmt.Sprintf("10.%d.%d.0/24", l/256, l%256)
			for k := range reporters {
				r.Add(loc, fmt.Sprintf("token%d|10.%d.%d.%d", k, l/256, l%256, k), rep(now, "gw1", 90*ms, "gw2", 20*ms, "gw3", 5*ms, "gw4", 40*ms), now)
			}
			r.Order(loc, now)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := float64(after.HeapAlloc-before.HeapAlloc) / n
		t.Logf("%d reporters x 4 gateways: %.0f bytes per location", reporters, per)
		if per > float64(reporters)*10*1000 {
			t.Errorf("%.0f bytes per location with %d reporters", per, reporters)
		}
		runtime.KeepAlive(r)
	}
}

func newSelB(b *testing.B, cfg Config) *Selector {
	s, err := NewSelector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
