package orca

import (
	"math"
	"strconv"
)

// Header names a backend reports its load in (xDS ORCA spec, "Inline
// Per-Request Format"). HeaderBin carries the BIN form without its prefix
// (gRPC's legacy metadata name).
const (
	Header    = "endpoint-load-metrics"
	HeaderBin = "endpoint-load-metrics-bin"
)

// Bounds on what a backend may send. A header over MaxHeaderLen bytes is
// refused before it is read, so a backend cannot make us scan megabytes per
// answer; the metric maps are capped so a Report is a fixed-size value the
// caller keeps on its stack. The spec's own examples carry one to three
// named metrics.
const (
	MaxHeaderLen = 2048
	MaxMetrics   = 16 // entries of named_metrics, utilization and request_cost together
	MaxNameLen   = 64 // bytes of one metric name
)

// Field is a bit set of the standard fields a report carried.
type Field uint16

const (
	FieldCPU Field = 1 << iota
	FieldMem
	FieldApp
	FieldRPS
	FieldEPS
	fieldRPSDeprecated // uint64 rps: accepted, not kept
	fieldNamed         // the map fields, for duplicate detection in JSON
	fieldUtilMap
	fieldCostMap
)

// Map says which of OrcaLoadReport's map fields a metric came from.
type Map uint8

const (
	MapNamed       Map = iota // named_metrics: opaque application metrics (gRPC A51, A64)
	MapUtilization            // utilization: further resource utilizations
	MapRequestCost            // request_cost: the cost of this one request
)

func (m Map) String() string {
	switch m {
	case MapUtilization:
		return "utilization"
	case MapRequestCost:
		return "request_cost"
	}
	return "named_metrics"
}

// Metric is one entry of a map field.
type Metric struct {
	Map   Map
	Name  string // a substring of the header for TEXT and JSON: no copy
	Value float64
}

// Report is one parsed OrcaLoadReport. It is a plain value of fixed size,
// so a caller parses into one on its stack and nothing escapes.
type Report struct {
	CPUUtilization         float64
	MemUtilization         float64
	ApplicationUtilization float64
	RPSFractional          float64
	EPS                    float64
	Has                    Field // which of the fields above were present
	NMetrics               int
	Metrics                [MaxMetrics]Metric
}

// Utilization is the figure A58 weighs an endpoint by:
// application_utilization when it is above zero, else cpu_utilization.
// ok is false when the report carries neither field.
func (r *Report) Utilization() (u float64, ok bool) {
	if r.Has&FieldApp != 0 && r.ApplicationUtilization > 0 {
		return r.ApplicationUtilization, true
	}
	if r.Has&(FieldCPU|FieldApp) == 0 {
		return 0, false
	}
	return r.CPUUtilization, true
}

// Named returns the value of named metric name.
func (r *Report) Named(name string) (float64, bool) {
	for i := range r.NMetrics {
		if m := &r.Metrics[i]; m.Map == MapNamed && m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// Parse reads the value of an endpoint-load-metrics header into r (which it
// resets first) and says why it refused it; on any reason but OK, r must
// not be used. The prefix picks the form: "TEXT ", "JSON " or "BIN ".
//
// TEXT and JSON allocate nothing: names are substrings of s. BIN allocates
// one string per map entry it carries.
func Parse(s string, r *Report) Reason {
	if why := begin(s, r); why != ReasonOK {
		return why
	}
	switch {
	case hasPrefix(s, "TEXT "):
		return parseText(s[5:], r)
	case hasPrefix(s, "JSON "):
		return parseJSON(s[5:], r)
	case hasPrefix(s, "BIN "):
		return parseBin(s[4:], r)
	}
	return ReasonUnknownFormat
}

// ParseBin reads the value of an endpoint-load-metrics-bin header (base64
// of the serialized proto, no prefix) into r.
func ParseBin(s string, r *Report) Reason {
	if why := begin(s, r); why != ReasonOK {
		return why
	}
	return parseBin(s, r)
}

// begin resets r and refuses an empty or oversized value before any of it
// is read.
func begin(s string, r *Report) Reason {
	*r = Report{}
	switch {
	case s == "":
		return ReasonEmpty
	case len(s) > MaxHeaderLen:
		return ReasonTooLong
	}
	return ReasonOK
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// The standard fields, by their proto name and (for JSON) their
// lowerCamelCase JSON name, as protojson accepts both.
type field struct {
	bit Field
	m   Map  // for map fields
	isM bool // a map field: its entries follow as "<name>.<key>" (TEXT) or an object (JSON)
}

func lookupField(name string) (field, bool) {
	switch name {
	case "cpu_utilization", "cpuUtilization":
		return field{bit: FieldCPU}, true
	case "mem_utilization", "memUtilization":
		return field{bit: FieldMem}, true
	case "application_utilization", "applicationUtilization":
		return field{bit: FieldApp}, true
	case "rps_fractional", "rpsFractional":
		return field{bit: FieldRPS}, true
	case "eps":
		return field{bit: FieldEPS}, true
	case "rps":
		return field{bit: fieldRPSDeprecated}, true
	case "named_metrics", "namedMetrics":
		return field{bit: fieldNamed, m: MapNamed, isM: true}, true
	case "utilization":
		return field{bit: fieldUtilMap, m: MapUtilization, isM: true}, true
	case "request_cost", "requestCost":
		return field{bit: fieldCostMap, m: MapRequestCost, isM: true}, true
	}
	return field{}, false
}

// setField stores v in the standard field f, refusing a repeat and values
// the proto's validation rules forbid (every standard field is >= 0,
// mem_utilization <= 1).
func (r *Report) setField(f Field, v float64) Reason {
	if r.Has&f != 0 {
		return ReasonDuplicate
	}
	if why := checkValue(v); why != ReasonOK {
		return why
	}
	if v < 0 || (f == FieldMem && v > 1) {
		return ReasonOutOfRange
	}
	r.Has |= f
	switch f {
	case FieldCPU:
		r.CPUUtilization = v
	case FieldMem:
		r.MemUtilization = v
	case FieldApp:
		r.ApplicationUtilization = v
	case FieldRPS:
		r.RPSFractional = v
	case FieldEPS:
		r.EPS = v
	}
	return ReasonOK
}

// addMetric appends a map entry, refusing a bad or repeated name and a
// report over the bound. A map value may be any finite number (A64: opaque
// to the load balancer).
func (r *Report) addMetric(m Map, name string, v float64) Reason {
	if !validName(name) {
		return ReasonBadName
	}
	if why := checkValue(v); why != ReasonOK {
		return why
	}
	for i := range r.NMetrics {
		if e := &r.Metrics[i]; e.Map == m && e.Name == name {
			return ReasonDuplicate
		}
	}
	if r.NMetrics == MaxMetrics {
		return ReasonTooManyMetrics
	}
	r.Metrics[r.NMetrics] = Metric{Map: m, Name: name, Value: v}
	r.NMetrics++
	return ReasonOK
}

func checkValue(v float64) Reason {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return ReasonNonFinite
	}
	return ReasonOK
}

// validName accepts 1..MaxNameLen bytes of visible ASCII: enough for any
// metric name the spec and its libraries use, and nothing that could carry
// a control character into a log or a metric label.
func validName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// parseNumber reads a decimal number. strconv on a substring allocates
// nothing; it also accepts "inf" and "nan", which checkValue then refuses
// with their own reason.
func parseNumber(s string) (float64, Reason) {
	if v, ok := plainDecimal(s); ok {
		return v, ReasonOK
	}
	if s == "" {
		return 0, ReasonBadNumber
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		if math.IsInf(v, 0) {
			return 0, ReasonNonFinite // overflow: strconv says ErrRange and ±Inf
		}
		return 0, ReasonBadNumber
	}
	return v, checkValue(v)
}

// pow10 holds the powers of ten a float64 represents exactly.
var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// plainDecimal reads the numbers backends send ("0.3", "10", "123.25":
// digits and at most one point, 15 digits at most) as strconv does in
// its exact path: the digits are an integer below 2^53 and the divisor a
// power of ten below 10^16, both exact in a float64, so the one division,
// rounded by IEEE 754, is the correctly rounded value. It is half the
// cost of strconv.ParseFloat, which first looks for signs, underscores,
// hex, exponents, "inf" and "nan"; anything else goes there
// (FuzzPlainDecimal checks the two agree).
func plainDecimal(s string) (float64, bool) {
	var m uint64
	digits, frac := 0, -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if digits == 15 {
				return 0, false
			}
			m = m*10 + uint64(c-'0')
			digits++
			if frac >= 0 {
				frac++
			}
		case c == '.' && frac < 0:
			frac = 0
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	return float64(m) / pow10[max(frac, 0)], true
}
