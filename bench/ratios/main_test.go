package main

import (
	"strings"
	"testing"
)

const sampleOutput = `goos: linux
BenchmarkSelect/anchor_least_conn/n=4-2   	1000	  60.0 ns/op	   0 B/op	   0 allocs/op
BenchmarkSelect/ours/n=4-2                	1000	  30.0 ns/op	   0 B/op	   0 allocs/op
BenchmarkSelect/anchor_least_conn/n=4-2   	1000	  70.0 ns/op	   0 B/op	   0 allocs/op
BenchmarkSelect/ours/n=4-2                	1000	  35.0 ns/op	   0 B/op	   0 allocs/op
BenchmarkSelect/anchor_least_conn/n=4-2   	1000	  80.0 ns/op	   0 B/op	   0 allocs/op
BenchmarkSelect/ours/n=4-2                	2026-11-30T13:57:50Z	INFO	a log line in the way
    1000	  40.0 ns/op	  16 B/op	   1 allocs/op
BenchmarkPlain-2                          	1000	  10.0 ns/op
PASS
`

func TestParseAndReportMedianRatios(t *testing.T) {
	samples, order, err := parse(strings.NewReader(sampleOutput))
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 {
		t.Fatalf("want 2 implementations, got %v", order)
	}
	ours := samples[key{group: "BenchmarkSelect/n=4", impl: "ours"}]
	if ours == nil || median(ours.nsPerOp) != 35 || len(ours.nsPerOp) != 3 {
		t.Fatalf("median of ours: %+v", ours)
	}
	var b strings.Builder
	report(&b, samples, order)
	if !strings.Contains(b.String(), "0.50x anchor_least_conn") {
		t.Fatalf("report lacks the ratio 35/70:\n%s", b.String())
	}
}

func TestMedianEven(t *testing.T) {
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatalf("median %v", m)
	}
}
