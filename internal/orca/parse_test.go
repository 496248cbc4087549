package orca

import (
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// want is what a parse should give: the reason, and on OK the fields.
type want struct {
	reason             Reason
	cpu, mem, app, rps float64
	eps                float64
	has                Field // FieldCPU..FieldEPS only
	metrics            []Metric
}

func check(t *testing.T, in string, r *Report, got Reason, w want) {
	t.Helper()
	if got != w.reason {
		t.Fatalf("%.80q: reason %v, want %v", in, got, w.reason)
	}
	if got != ReasonOK {
		return
	}
	std := FieldCPU | FieldMem | FieldApp | FieldRPS | FieldEPS
	if r.Has&std != w.has {
		t.Errorf("%.80q: has %b, want %b", in, r.Has&std, w.has)
	}
	if r.CPUUtilization != w.cpu || r.MemUtilization != w.mem || r.ApplicationUtilization != w.app ||
		r.RPSFractional != w.rps || r.EPS != w.eps {
		t.Errorf("%.80q: cpu %v mem %v app %v rps %v eps %v, want %v %v %v %v %v", in,
			r.CPUUtilization, r.MemUtilization, r.ApplicationUtilization, r.RPSFractional, r.EPS,
			w.cpu, w.mem, w.app, w.rps, w.eps)
	}
	if r.NMetrics != len(w.metrics) {
		t.Fatalf("%.80q: %d metrics %v, want %v", in, r.NMetrics, r.Metrics[:r.NMetrics], w.metrics)
	}
	for i, m := range w.metrics {
		if r.Metrics[i] != m {
			t.Errorf("%.80q: metric %d = %+v, want %+v", in, i, r.Metrics[i], m)
		}
	}
}

func named(kv ...any) []Metric {
	var ms []Metric
	for i := 0; i < len(kv); i += 2 {
		ms = append(ms, Metric{Map: MapNamed, Name: kv[i].(string), Value: kv[i+1].(float64)})
	}
	return ms
}

func manyMetrics(form string, n int) string {
	var b strings.Builder
	for i := range n {
		name := "m" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if form == "TEXT" {
			b.WriteString(",named_metrics." + name + "=1")
		} else {
			b.WriteString(`,"` + name + `":1`)
		}
	}
	if form == "TEXT" {
		return "TEXT " + b.String()[1:]
	}
	return `JSON {"named_metrics":{` + b.String()[1:] + `}}`
}

var all = FieldCPU | FieldMem | FieldApp | FieldRPS | FieldEPS

var parseCases = []struct {
	name string
	in   string
	w    want
}{
	// The spec's TEXT example.
	{"text spec", "TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10.0, eps=1, named_metrics.custom_metric_util=0.4",
		want{cpu: 0.3, mem: 0.8, rps: 10, eps: 1, has: FieldCPU | FieldMem | FieldRPS | FieldEPS, metrics: named("custom_metric_util", 0.4)}},
	{"text all fields and maps", "TEXT cpu_utilization=0.7,application_utilization=0.8,mem_utilization=0.9,rps_fractional=1000,eps=2,named_metrics.foo=123,named_metrics.bar=0.2,utilization.total=0.5,request_cost.db=-3",
		want{cpu: 0.7, app: 0.8, mem: 0.9, rps: 1000, eps: 2, has: all, metrics: append(named("foo", 123.0, "bar", 0.2),
			Metric{MapUtilization, "total", 0.5}, Metric{MapRequestCost, "db", -3})}},
	{"text colons", "TEXT cpu_utilization:0.7, named_metrics.foo:1", want{cpu: 0.7, has: FieldCPU, metrics: named("foo", 1.0)}},
	{"text equals before colon", "TEXT named_metrics.a:b=2", want{metrics: named("a:b", 2.0)}},
	{"text empty items and tabs", "TEXT ,cpu_utilization = 0.5 ,,\t, ", want{cpu: 0.5, has: FieldCPU}},
	{"text no items", "TEXT ", want{}},
	{"text zero", "TEXT cpu_utilization=0", want{has: FieldCPU}},
	{"text deprecated rps", "TEXT rps=5,cpu_utilization=0.1", want{cpu: 0.1, has: FieldCPU}},
	{"text max name", "TEXT named_metrics." + strings.Repeat("n", MaxNameLen) + "=1", want{metrics: named(strings.Repeat("n", MaxNameLen), 1.0)}},
	{"text max metrics", manyMetrics("TEXT", MaxMetrics), want{metrics: nil}}, // metrics checked by count below
	{"text same name in two maps", "TEXT named_metrics.x=1,utilization.x=0.5", want{metrics: append(named("x", 1.0), Metric{MapUtilization, "x", 0.5})}},

	{"empty", "", want{reason: ReasonEmpty}},
	{"no prefix", "cpu_utilization=0.3", want{reason: ReasonUnknownFormat}},
	{"lower-case prefix", "text cpu_utilization=0.3", want{reason: ReasonUnknownFormat}},
	{"prefix without space", "TEXTcpu_utilization=0.3", want{reason: ReasonUnknownFormat}},
	{"other prefix", "XML <cpu/>", want{reason: ReasonUnknownFormat}},
	{"too long", "TEXT cpu_utilization=0.3," + strings.Repeat(" ", MaxHeaderLen), want{reason: ReasonTooLong}},
	{"text no separator", "TEXT cpu_utilization", want{reason: ReasonSyntax}},
	{"text empty name", "TEXT =1", want{reason: ReasonUnknownField}},
	{"text unknown field", "TEXT gpu_utilization=0.3", want{reason: ReasonUnknownField}},
	{"text unknown map", "TEXT bogus.x=1", want{reason: ReasonUnknownField}},
	{"text scalar as map", "TEXT cpu_utilization.x=1", want{reason: ReasonUnknownField}},
	{"text map as scalar", "TEXT named_metrics=1", want{reason: ReasonUnknownField}},
	{"text empty value", "TEXT cpu_utilization=", want{reason: ReasonBadNumber}},
	{"text word value", "TEXT cpu_utilization=high", want{reason: ReasonBadNumber}},
	{"text quoted value", `TEXT cpu_utilization="0.7"`, want{reason: ReasonBadNumber}},
	{"text NaN", "TEXT cpu_utilization=NaN", want{reason: ReasonNonFinite}},
	{"text Inf", "TEXT named_metrics.x=-inf", want{reason: ReasonNonFinite}},
	{"text overflow", "TEXT eps=1e400", want{reason: ReasonNonFinite}},
	{"text negative", "TEXT cpu_utilization=-0.1", want{reason: ReasonOutOfRange}},
	{"text negative rps", "TEXT rps_fractional=-1", want{reason: ReasonOutOfRange}},
	{"text mem over 1", "TEXT mem_utilization=1.5", want{reason: ReasonOutOfRange}},
	{"text duplicate field", "TEXT cpu_utilization=0.1,cpu_utilization=0.9", want{reason: ReasonDuplicate}},
	{"text duplicate metric", "TEXT named_metrics.a=1,named_metrics.a=2", want{reason: ReasonDuplicate}},
	{"text empty metric name", "TEXT named_metrics.=1", want{reason: ReasonBadName}},
	{"text metric name with space", "TEXT named_metrics.a b=1", want{reason: ReasonBadName}},
	{"text metric name non-ASCII", "TEXT named_metrics.é=1", want{reason: ReasonBadName}},
	{"text metric name too long", "TEXT named_metrics." + strings.Repeat("n", MaxNameLen+1) + "=1", want{reason: ReasonBadName}},
	{"text too many metrics", manyMetrics("TEXT", MaxMetrics+1), want{reason: ReasonTooManyMetrics}},

	// The spec's JSON example (with ASCII quotes).
	{"json spec", `JSON {"cpu_utilization": 0.3, "mem_utilization": 0.8, "rps_fractional": 10.0, "eps": 1, "named_metrics": {"custom-metric-util": 0.4}}`,
		want{cpu: 0.3, mem: 0.8, rps: 10, eps: 1, has: FieldCPU | FieldMem | FieldRPS | FieldEPS, metrics: named("custom-metric-util", 0.4)}},
	{"json camel case", `JSON {"cpuUtilization":0.7,"applicationUtilization":0.8,"memUtilization":0.9,"rpsFractional":1000,"eps":2,"namedMetrics":{"foo":123},"utilization":{"t":0.5},"requestCost":{"db":3}}`,
		want{cpu: 0.7, app: 0.8, mem: 0.9, rps: 1000, eps: 2, has: all, metrics: append(named("foo", 123.0),
			Metric{MapUtilization, "t", 0.5}, Metric{MapRequestCost, "db", 3})}},
	{"json numbers as strings", `JSON {"cpu_utilization":"0.25","named_metrics":{"a":"-1e2"}}`, want{cpu: 0.25, has: FieldCPU, metrics: named("a", -100.0)}},
	{"json whitespace", "JSON \n{ \"eps\" :\t2 ,\r\n\"named_metrics\" : { } } \n", want{eps: 2, has: FieldEPS}},
	{"json empty object", "JSON {}", want{}},
	{"json max metrics", manyMetrics("JSON", MaxMetrics), want{}},

	{"json empty", "JSON ", want{reason: ReasonSyntax}},
	{"json open", `JSON {"eps":1`, want{reason: ReasonSyntax}},
	{"json array", `JSON [1]`, want{reason: ReasonSyntax}},
	{"json trailing garbage", `JSON {"eps":1} x`, want{reason: ReasonSyntax}},
	{"json trailing comma", `JSON {"eps":1,}`, want{reason: ReasonSyntax}},
	{"json missing colon", `JSON {"eps" 1}`, want{reason: ReasonSyntax}},
	{"json bool", `JSON {"eps":true}`, want{reason: ReasonSyntax}},
	{"json null", `JSON {"eps":null}`, want{reason: ReasonSyntax}},
	{"json nested in scalar", `JSON {"eps":{"a":1}}`, want{reason: ReasonSyntax}},
	{"json scalar for map", `JSON {"named_metrics":1}`, want{reason: ReasonSyntax}},
	{"json nested map", `JSON {"named_metrics":{"a":{"b":1}}}`, want{reason: ReasonSyntax}},
	{"json escape in key", `JSON {"named_metrics":{"a\"b":1}}`, want{reason: ReasonSyntax}},
	{"json escaped backslash in key", `JSON {"named_metrics":{"a\\b":1}}`, want{reason: ReasonSyntax}},
	{"json unterminated key", `JSON {"eps`, want{reason: ReasonSyntax}},
	{"json unknown field", `JSON {"gpu":1}`, want{reason: ReasonUnknownField}},
	{"json duplicate field", `JSON {"eps":1,"eps":2}`, want{reason: ReasonDuplicate}},
	{"json duplicate by alias", `JSON {"cpu_utilization":0.1,"cpuUtilization":0.2}`, want{reason: ReasonDuplicate}},
	{"json duplicate map", `JSON {"named_metrics":{"a":1},"namedMetrics":{"b":1}}`, want{reason: ReasonDuplicate}},
	{"json duplicate key", `JSON {"named_metrics":{"a":1,"a":2}}`, want{reason: ReasonDuplicate}},
	{"json NaN string", `JSON {"cpu_utilization":"NaN"}`, want{reason: ReasonNonFinite}},
	{"json Infinity string", `JSON {"named_metrics":{"x":"Infinity"}}`, want{reason: ReasonNonFinite}},
	{"json overflow", `JSON {"eps":1e999}`, want{reason: ReasonNonFinite}},
	{"json bad number", `JSON {"eps":1-2}`, want{reason: ReasonBadNumber}},
	{"json negative", `JSON {"application_utilization":-1}`, want{reason: ReasonOutOfRange}},
	{"json mem over 1", `JSON {"mem_utilization":2}`, want{reason: ReasonOutOfRange}},
	{"json bad name", `JSON {"named_metrics":{"":1}}`, want{reason: ReasonBadName}},
	{"json too many metrics", manyMetrics("JSON", MaxMetrics+1), want{reason: ReasonTooManyMetrics}},

	// The spec's BIN example: cpu 0.1, rps_fractional 2, named foo 0.1, bar 0.2.
	{"bin spec", "BIN CZqZmZmZmbk/MQAAAAAAAABAQg4KA2ZvbxGamZmZmZm5P0IOCgNiYXIRmpmZmZmZyT8=",
		want{cpu: 0.1, rps: 2, has: FieldCPU | FieldRPS, metrics: named("foo", 0.1, "bar", 0.2)}},
	{"bin unpadded", "BIN CZqZmZmZmbk/MQAAAAAAAABAQg4KA2ZvbxGamZmZmZm5P0IOCgNiYXIRmpmZmZmZyT8",
		want{cpu: 0.1, rps: 2, has: FieldCPU | FieldRPS, metrics: named("foo", 0.1, "bar", 0.2)}},
	{"bin empty", "BIN ", want{}},
	{"bin not base64", "BIN !!!!", want{reason: ReasonBadBase64}},
	{"bin truncated", "BIN CZqZmZmZ", want{reason: ReasonBadProto}},
}

func TestParse(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			var r Report
			got := Parse(c.in, &r)
			w := c.w
			if strings.Contains(c.name, "max metrics") {
				if got != ReasonOK || r.NMetrics != MaxMetrics {
					t.Fatalf("reason %v with %d metrics, want ok with %d", got, r.NMetrics, MaxMetrics)
				}
				return
			}
			check(t, c.in, &r, got, w)
		})
	}
}

// TestParseResets: a Report reused for the next answer keeps nothing of
// the previous one.
func TestParseResets(t *testing.T) {
	var r Report
	Parse("TEXT cpu_utilization=0.9,named_metrics.a=1", &r)
	if Parse("TEXT eps=1", &r) != ReasonOK || r.Has&FieldCPU != 0 || r.CPUUtilization != 0 || r.NMetrics != 0 {
		t.Fatalf("reused report kept old fields: %+v", r)
	}
}

// binReport builds a serialized OrcaLoadReport with protowire, the codec
// the parser reads it with, so the field numbers are checked against the
// spec's example above as well as this.
type binField struct {
	num protowire.Number
	v   float64
}

func binReport(scalars []binField, maps map[protowire.Number][][2]any, extra func([]byte) []byte) string {
	var b []byte
	for _, f := range scalars {
		b = protowire.AppendTag(b, f.num, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(f.v))
	}
	for _, num := range []protowire.Number{protoRequestCost, protoUtilization, protoNamed} {
		for _, kv := range maps[num] {
			var e []byte
			e = protowire.AppendTag(e, 1, protowire.BytesType)
			e = protowire.AppendString(e, kv[0].(string))
			e = protowire.AppendTag(e, 2, protowire.Fixed64Type)
			e = protowire.AppendFixed64(e, math.Float64bits(kv[1].(float64)))
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		}
	}
	if extra != nil {
		b = extra(b)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestParseBin(t *testing.T) {
	unknown := func(b []byte) []byte { // fields a newer proto may add, and the deprecated uint64 rps
		b = protowire.AppendTag(b, protoRPS, protowire.VarintType)
		b = protowire.AppendVarint(b, 7)
		b = protowire.AppendTag(b, 99, protowire.BytesType)
		return protowire.AppendString(b, "future")
	}
	full := binReport([]binField{{protoCPU, 0.7}, {protoMem, 0.9}, {protoRPSFrac, 1000}, {protoEPS, 2}, {protoApp, 0.8}},
		map[protowire.Number][][2]any{protoNamed: {{"foo", 123.0}}, protoUtilization: {{"t", 0.5}}, protoRequestCost: {{"db", 3.0}}}, unknown)
	cases := []struct {
		name string
		in   string
		w    want
	}{
		{"all fields, unknown skipped", full, want{cpu: 0.7, mem: 0.9, rps: 1000, eps: 2, app: 0.8, has: all,
			metrics: []Metric{{MapRequestCost, "db", 3}, {MapUtilization, "t", 0.5}, {MapNamed, "foo", 123}}}},
		{"repeated scalar: last wins", binReport([]binField{{protoCPU, 0.1}, {protoCPU, 0.4}}, nil, nil), want{cpu: 0.4, has: FieldCPU}},
		{"NaN", binReport([]binField{{protoCPU, math.NaN()}}, nil, nil), want{reason: ReasonNonFinite}},
		{"negative", binReport([]binField{{protoApp, -1}}, nil, nil), want{reason: ReasonOutOfRange}},
		{"empty key", binReport(nil, map[protowire.Number][][2]any{protoNamed: {{"", 1.0}}}, nil), want{reason: ReasonBadName}},
		{"long key", binReport(nil, map[protowire.Number][][2]any{protoNamed: {{strings.Repeat("k", MaxNameLen+1), 1.0}}}, nil), want{reason: ReasonBadName}},
		{"duplicate key", binReport(nil, map[protowire.Number][][2]any{protoNamed: {{"a", 1.0}, {"a", 2.0}}}, nil), want{reason: ReasonDuplicate}},
		{"scalar as bytes", binReport(nil, nil, func(b []byte) []byte {
			return protowire.AppendBytes(protowire.AppendTag(b, protoCPU, protowire.BytesType), []byte{1})
		}), want{}}, // a wrong wire type is an unknown field to protobuf: skipped
		{"truncated entry", binReport(nil, nil, func(b []byte) []byte {
			return append(protowire.AppendTag(b, protoNamed, protowire.BytesType), 5, 1)
		}), want{reason: ReasonBadProto}},
		{"truncated map entry inside", binReport(nil, nil, func(b []byte) []byte {
			return protowire.AppendBytes(protowire.AppendTag(b, protoNamed, protowire.BytesType), []byte{0x0a, 9, 'a'})
		}), want{reason: ReasonBadProto}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Report
			check(t, c.in, &r, ParseBin(c.in, &r), c.w)
			var r2 Report
			check(t, "BIN "+c.in, &r2, Parse("BIN "+c.in, &r2), c.w)
		})
	}
	var r Report
	if got := ParseBin("", &r); got != ReasonEmpty {
		t.Errorf("empty: %v", got)
	}
	if got := ParseBin(strings.Repeat("A", MaxHeaderLen+4), &r); got != ReasonTooLong {
		t.Errorf("too long: %v", got)
	}
}

func TestReportUtilization(t *testing.T) {
	cases := []struct {
		in string
		u  float64
		ok bool
	}{
		{"TEXT application_utilization=0.8,cpu_utilization=0.3", 0.8, true},
		{"TEXT application_utilization=0,cpu_utilization=0.3", 0.3, true}, // A58: app 0 falls back to cpu
		{"TEXT cpu_utilization=0.3", 0.3, true},
		{"TEXT application_utilization=0", 0, true},
		{"TEXT cpu_utilization=0", 0, true},
		{"TEXT mem_utilization=0.9,rps_fractional=3,named_metrics.a=1", 0, false},
	}
	for _, c := range cases {
		var r Report
		if why := Parse(c.in, &r); why != ReasonOK {
			t.Fatalf("%q: %v", c.in, why)
		}
		if u, ok := r.Utilization(); u != c.u || ok != c.ok {
			t.Errorf("%q: utilization %v %v, want %v %v", c.in, u, ok, c.u, c.ok)
		}
	}
	var r Report
	Parse("TEXT utilization.q=0.5,named_metrics.q=4", &r)
	if v, ok := r.Named("q"); v != 4 || !ok {
		t.Errorf("Named(q) = %v %v, want 4 true", v, ok)
	}
	if _, ok := r.Named("z"); ok {
		t.Error("Named(z) found")
	}
}

// TestParseAllocations: the common forms allocate nothing (the issue's
// bar), so a change that makes them allocate fails here, not only in a
// benchmark nobody reads.
func TestParseAllocations(t *testing.T) {
	for _, in := range []string{benchText, benchJSON, benchTextNamed, benchJSONNamed} {
		var r Report
		if n := testing.AllocsPerRun(100, func() { Parse(in, &r) }); n != 0 {
			t.Errorf("%q: %v allocations per parse, want 0", in, n)
		}
	}
}

// TestParseBinLongKeyAllocates nothing: an over-long key is refused before
// the string is made, so a backend cannot make us copy names we refuse.
func TestParseBinLongKeyAllocates(t *testing.T) {
	in := binReport(nil, map[protowire.Number][][2]any{protoNamed: {{strings.Repeat("k", MaxNameLen+1), 1.0}}}, nil)
	var r Report
	if n := testing.AllocsPerRun(100, func() { ParseBin(in, &r) }); n != 0 {
		t.Errorf("%v allocations refusing a long key, want 0", n)
	}
}

// TestPlainDecimalMatchesStrconv: 16- and 17-digit decimals (beyond what
// the fast path may take: their integer is not exact below 2^53) either
// go to strconv or come out identical to it.
func TestPlainDecimalMatchesStrconv(t *testing.T) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := range 20000 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		digits := strconv.FormatUint(x%1e17, 10)
		s := digits[:1] + "." + digits[1:] // 0 to 16 fraction digits
		if i%2 == 1 {
			s = "0." + digits
		}
		v, ok := plainDecimal(s)
		if !ok {
			continue
		}
		if want, _ := strconv.ParseFloat(s, 64); v != want {
			t.Fatalf("%q: fast path %v, strconv %v", s, v, want)
		}
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumReasons {
		s := r.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("reason %d has name %q", r, s)
		}
		seen[s] = true
	}
	if NumReasons.String() != "unknown" {
		t.Error("out-of-range reason named")
	}
}
