package rttreports

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkReportAdd is one accepted report (4 gateways) into a location
// with 64 reporters, and one aggregation after it (the next query's).
func BenchmarkReportAdd(b *testing.B) {
	r := NewReports()
	r.Configure(Config{Enabled: true}, exampleGateways(), false)
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
		r.Configure(Config{Enabled: true, MaxLocations: n}, exampleGateways(), false)
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
