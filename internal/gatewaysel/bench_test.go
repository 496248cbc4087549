package gatewaysel

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/latency"
)

// BenchmarkProbeRun1000Gateways is one probe run (3 TCP probes each) over
// 1,000 real loopback listeners, bounded by the default 7 s deadline. It
// reports how many gateways were measured inside the deadline, the run's
// milliseconds, and the bytes allocated per run.
func BenchmarkProbeRun1000Gateways(b *testing.B) {
	const n = 1000
	gws := make([]gatewayorder.Gateway, n)
	for i := range gws {
		gws[i] = gatewayorder.Gateway{Name: fmt.Sprintf("gw%d", i), Addr: e2e.ClosingListener(b)}
	}
	s, err := NewTable(Config{Gateways: gws, Prober: latency.TCPProber{}, Deadline: DefaultDeadline, AnswerDeadline: DefaultDeadline})
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	measured, runs := 0, 0
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		res, src := pick(s.Select(context.Background(), fmt.Sprint("loc-", i)))
		if src != Probed {
			b.Fatalf("run %d: %v, want a finished probe run inside the deadline", i, src)
		}
		for _, rtt := range res.RTTs {
			if rtt > 0 {
				measured++
			}
		}
		runs++
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(measured)/float64(runs), "gateways_measured/run")
	b.ReportMetric(float64(elapsed.Milliseconds())/float64(runs), "ms/run")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(runs), "alloc_B/run")
}
