package orca

// Reason says why a header was not taken, so that callers count each kind
// apart (one counter per reason, labelled with its String). ReasonOK is the
// zero value.
type Reason uint8

const (
	ReasonOK             Reason = iota
	ReasonEmpty                 // an empty header value
	ReasonTooLong               // over MaxHeaderLen bytes
	ReasonUnknownFormat         // no "TEXT ", "JSON " or "BIN " prefix
	ReasonSyntax                // not the form its prefix announced
	ReasonUnknownField          // a field OrcaLoadReport does not have (TEXT, JSON)
	ReasonDuplicate             // a field or map key given twice
	ReasonBadNumber             // a value that is not a number
	ReasonNonFinite             // NaN or ±Inf, or a number that overflows to it
	ReasonOutOfRange            // a negative standard field, or mem_utilization above 1
	ReasonBadName               // a map key empty, over MaxNameLen, or not visible ASCII
	ReasonTooManyMetrics        // over MaxMetrics map entries
	ReasonBadBase64             // BIN: not base64
	ReasonBadProto              // BIN: not a serialized OrcaLoadReport
	ReasonNoUtilization         // Observe: neither cpu_utilization nor application_utilization
	ReasonTableFull             // Tracker: MaxUpstreams reached, none stale to evict
	NumReasons                  // the number of reasons, for arrays of counters
)

var reasonNames = [NumReasons]string{
	"ok", "empty", "too_long", "unknown_format", "syntax", "unknown_field", "duplicate",
	"bad_number", "non_finite", "out_of_range", "bad_name", "too_many_metrics",
	"bad_base64", "bad_proto", "no_utilization", "table_full",
}

// String is the reason's name as a metric label: lower case, underscores.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}
