package orca

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// FuzzParse: no input panics, every answer is a known reason, and an
// accepted report holds only what the bounds and rules allow.
func FuzzParse(f *testing.F) {
	for _, c := range parseCases {
		f.Add(c.in)
	}
	for _, s := range []string{benchText, benchJSON, benchTextNamed, benchJSONNamed, benchBin,
		"BIN " + strings.Repeat("/", 8), "JSON {\"named_metrics\":{\"a\":1e-400}}", "TEXT eps=0x1p-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var r Report
		why := Parse(s, &r)
		if why >= NumReasons || why == ReasonNoUtilization || why == ReasonTableFull {
			t.Fatalf("%q: reason %d (%v) is not a parse reason", s, why, why)
		}
		if len(s) > MaxHeaderLen && why != ReasonTooLong {
			t.Fatalf("%d bytes: %v, want too_long", len(s), why)
		}
		if why != ReasonOK {
			return
		}
		for _, v := range []float64{r.CPUUtilization, r.MemUtilization, r.ApplicationUtilization, r.RPSFractional, r.EPS} {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("%q: standard field %v", s, v)
			}
		}
		if r.MemUtilization > 1 {
			t.Fatalf("%q: mem_utilization %v", s, r.MemUtilization)
		}
		if r.NMetrics < 0 || r.NMetrics > MaxMetrics {
			t.Fatalf("%q: %d metrics", s, r.NMetrics)
		}
		for _, m := range r.Metrics[:r.NMetrics] {
			if !validName(m.Name) || math.IsNaN(m.Value) || math.IsInf(m.Value, 0) {
				t.Fatalf("%q: metric %+v", s, m)
			}
			if !strings.HasPrefix(s, "BIN ") && !strings.Contains(s, m.Name) {
				t.Fatalf("%q: name %q not from the header", s, m.Name)
			}
		}
		if u, ok := r.Utilization(); ok && !(u >= 0) {
			t.Fatalf("%q: utilization %v", s, u)
		}
	})
}

// FuzzPlainDecimal: the fast path gives exactly what strconv gives,
// wherever it answers.
func FuzzPlainDecimal(f *testing.F) {
	for _, s := range []string{"0.3", "10", "123.25", "0.1", "999999999999999", "1.", ".5", "0.000000000000001", "7.000000000000001", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := plainDecimal(s)
		if !ok {
			return
		}
		want, err := strconv.ParseFloat(s, 64)
		if err != nil || v != want {
			t.Fatalf("%q: fast path %v, strconv %v (%v)", s, v, want, err)
		}
	})
}
