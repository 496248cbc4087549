package orca

import (
	"encoding/json"
	"syscall"
	"testing"
)

// cpuNanos is the CPU time this process has used. Beside the wall-clock
// ns/op, a benchmark reports cpu-ns/op: on a host shared with other jobs
// (load 15 on 2 cores is common here) wall time per op is mostly waiting
// for a core, while CPU time per op is the cost itself. The loops below
// allocate nothing, so the benchmark goroutine is the only consumer.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// loop runs op b.N times and reports its CPU time per op.
func loop(b *testing.B, op func()) {
	b.ReportAllocs()
	b.ResetTimer()
	start := cpuNanos()
	for range b.N {
		op()
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuNanos()-start)/float64(b.N), "cpu-ns/op")
}

const (
	benchText      = "TEXT cpu_utilization=0.3, application_utilization=0.25, rps_fractional=10, eps=0.5"
	benchJSON      = `JSON {"cpu_utilization":0.3,"application_utilization":0.25,"rps_fractional":10,"eps":0.5}`
	benchTextNamed = "TEXT cpu_utilization=0.3, rps_fractional=10, named_metrics.foo=123, named_metrics.queue=4"
	benchJSONNamed = `JSON {"cpu_utilization":0.3,"rps_fractional":10,"named_metrics":{"foo":123,"queue":4}}`
	benchBin       = "BIN CZqZmZmZmbk/MQAAAAAAAABAQg4KA2ZvbxGamZmZmZm5P0IOCgNiYXIRmpmZmZmZyT8="
)

// jsonReport is what encoding/json would fill: the anchor for the JSON
// form (what a straightforward parser costs).
type jsonReport struct {
	CPU   float64            `json:"cpu_utilization"`
	App   float64            `json:"application_utilization"`
	Mem   float64            `json:"mem_utilization"`
	RPS   float64            `json:"rps_fractional"`
	EPS   float64            `json:"eps"`
	Named map[string]float64 `json:"named_metrics"`
}

// BenchmarkParse: our parser per form, beside encoding/json on the JSON
// body (anchor_encoding_json). Ratios: go run ./bench/ratios.
func BenchmarkParse(b *testing.B) {
	for _, c := range []struct{ name, in string }{
		{"text", benchText}, {"json", benchJSON}, {"text_named", benchTextNamed},
		{"json_named", benchJSONNamed}, {"bin_named", benchBin},
	} {
		b.Run("scanner/"+c.name, func(b *testing.B) {
			var r Report
			loop(b, func() {
				if Parse(c.in, &r) != ReasonOK {
					b.Fatal("refused")
				}
			})
		})
	}
	for _, c := range []struct{ name, in string }{{"json", benchJSON[5:]}, {"json_named", benchJSONNamed[5:]}} {
		b.Run("anchor_encoding_json/"+c.name, func(b *testing.B) {
			body := []byte(c.in)
			loop(b, func() {
				var r jsonReport
				if json.Unmarshal(body, &r) != nil {
					b.Fatal("refused")
				}
			})
		})
	}
}

// BenchmarkUpstream: recording a report and reading the utilization, the
// two operations on the request and pick paths.
func BenchmarkUpstream(b *testing.B) {
	var r Report
	Parse(benchText, &r)
	var u Upstream
	p := DefaultPeriods
	b.Run("observe", func(b *testing.B) {
		now := int64(1)
		loop(b, func() {
			now++
			u.Observe(&r, now, p)
		})
	})
	b.Run("utilization", func(b *testing.B) {
		loop(b, func() { u.Utilization(2e10, p) })
	})
	b.Run("observe_parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				u.Observe(&r, 1e10, p)
			}
		})
	})
}
