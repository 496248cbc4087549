package doic

import (
	"encoding/binary"
	"time"
)

// AVP codes (RFC 7683 §7, RFC 8581, RFC 8583); the README's DOIC
// section says where each value was checked.
const (
	CodeSupportedFeatures = 621
	CodeFeatureVector     = 622
	CodeOLR               = 623
	CodeSequenceNumber    = 624
	CodeValidityDuration  = 625
	CodeReportType        = 626
	CodeReductionPercent  = 627
	CodePeerAlgo          = 648
	CodeSourceID          = 649
	CodeLoad              = 650
	CodeLoadType          = 651
	CodeLoadValue         = 652
)

// Feature bits of OC-Feature-Vector.
const (
	FeatureLoss       = 0x1  // OLR_DEFAULT_ALGO (RFC 7683 §7.3)
	FeaturePeerReport = 0x10 // OLR_PEER_REPORT (RFC 8581 §6.1.1)
)

// ReportType is OC-Report-Type.
type ReportType uint8

const (
	HostReport  ReportType = 0
	RealmReport ReportType = 1
	PeerReport  ReportType = 2 // RFC 8581
	numTypes               = 3
)

func (t ReportType) String() string {
	switch t {
	case HostReport:
		return "host"
	case RealmReport:
		return "realm"
	case PeerReport:
		return "peer"
	}
	return "unknown"
}

// Load-Type values (RFC 8583: HOST 0, PEER 1).
const (
	LoadHost = 0
	LoadPeer = 1
)

// Limits of RFC 7683 §7.4 and §7.7, and RFC 8583 §6.3.
const (
	MaxValidity     = 86400 * time.Second
	DefaultValidity = 30 * time.Second
	MaxLoadValue    = 65535
)

// Reason is why an OC-OLR or Load AVP was ignored.
type Reason uint8

const (
	OK Reason = iota
	Malformed
	NoSequence
	NoReportType
	BadReportType
	ReductionOver100
	ValidityOver86400
	PeerNotAdjacent
	Stale
	TableFull
	BadLoad
	numReasons
)

var reasonNames = [numReasons]string{"ok", "malformed", "no_sequence", "no_report_type", "bad_report_type",
	"reduction_over_100", "validity_over_86400", "peer_not_adjacent", "stale", "table_full", "bad_load"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Reasons lists every reason but OK, for metrics.
func Reasons() []Reason {
	out := make([]Reason, 0, numReasons-1)
	for r := Malformed; r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// OLR is a parsed OC-OLR.
type OLR struct {
	Seq       uint64
	Type      ReportType
	Reduction uint32
	Validity  time.Duration
	SourceID  []byte // RFC 8581: the peer that made a PEER report (a slice of the message)
}

// Load is a parsed Load AVP.
type Load struct {
	Type     uint32
	Value    uint64
	SourceID []byte
}

// Found holds the DOIC and Load AVPs of one message, as slices of it: up
// to four of each (more are counted in Extra and ignored: no peer sends
// more than a host, a realm and a peer report).
type Found struct {
	Supported    []byte // OC-Supported-Features data (nil: absent)
	HasSupported bool
	OLRs         [4][]byte
	NOLR         int
	Loads        [4][]byte
	NLoad        int
	Extra        int
}

// Reset empties f for the next message.
func (f *Found) Reset() { *f = Found{} }

// Any reports whether the message had any DOIC or Load AVP.
func (f *Found) Any() bool { return f.HasSupported || f.NOLR > 0 || f.NLoad > 0 }

// Note records a top-level AVP if it is one of ours (vendor-less ones
// only: ours have no Vendor-Id). It reports whether it was.
func (f *Found) Note(code uint32, data []byte) bool {
	switch code {
	case CodeSupportedFeatures:
		f.Supported, f.HasSupported = data, true
	case CodeOLR:
		if f.NOLR == len(f.OLRs) {
			f.Extra++
		} else {
			f.OLRs[f.NOLR] = data
			f.NOLR++
		}
	case CodeLoad:
		if f.NLoad == len(f.Loads) {
			f.Extra++
		} else {
			f.Loads[f.NLoad] = data
			f.NLoad++
		}
	default:
		return false
	}
	return true
}

// Scan records the DOIC and Load AVPs among the top-level AVPs of body (a
// message without its 20-byte header). It stops at the first malformed
// AVP header and reports false.
func Scan(body []byte, f *Found) bool {
	return walk(body, func(code uint32, vendor bool, data []byte) bool {
		if !vendor {
			f.Note(code, data)
		}
		return true
	})
}

// walk calls fn with each AVP of b, checking every length; false when b is
// malformed or fn said stop.
func walk(b []byte, fn func(code uint32, vendor bool, data []byte) bool) bool {
	for len(b) > 0 {
		if len(b) < 8 {
			return false
		}
		code := binary.BigEndian.Uint32(b)
		l := int(b[5])<<16 | int(b[6])<<8 | int(b[7])
		hdr := 8
		vendor := b[4]&0x80 != 0
		if vendor {
			hdr = 12
		}
		if l < hdr || l > len(b) {
			return false
		}
		if !fn(code, vendor, b[hdr:l]) {
			return false
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return true
}

// ParseOLR reads an OC-OLR's data, checking it as the package doc says.
func ParseOLR(data []byte) (o OLR, r Reason) {
	var hasSeq, hasType bool
	validity := uint64(DefaultValidity / time.Second)
	ok := walk(data, func(code uint32, vendor bool, d []byte) bool {
		if vendor {
			return true
		}
		switch code {
		case CodeSequenceNumber:
			if len(d) != 8 {
				return false
			}
			o.Seq, hasSeq = binary.BigEndian.Uint64(d), true
		case CodeReportType:
			if len(d) != 4 {
				return false
			}
			t := binary.BigEndian.Uint32(d)
			if t >= numTypes {
				r = BadReportType
			}
			o.Type, hasType = ReportType(min(t, 255)), true
		case CodeReductionPercent:
			if len(d) != 4 {
				return false
			}
			o.Reduction = binary.BigEndian.Uint32(d)
		case CodeValidityDuration:
			if len(d) != 4 {
				return false
			}
			validity = uint64(binary.BigEndian.Uint32(d))
		case CodeSourceID:
			o.SourceID = d
		}
		return true
	})
	switch {
	case !ok:
		return o, Malformed
	case !hasSeq:
		return o, NoSequence
	case !hasType:
		return o, NoReportType
	case r != OK:
		return o, r
	case o.Reduction > 100:
		return o, ReductionOver100
	case validity > uint64(MaxValidity/time.Second):
		return o, ValidityOver86400
	}
	o.Validity = time.Duration(validity) * time.Second
	return o, OK
}

// ParseLoad reads a Load AVP's data (RFC 8583 §6.1).
func ParseLoad(data []byte) (l Load, r Reason) {
	hasValue := false
	ok := walk(data, func(code uint32, vendor bool, d []byte) bool {
		if vendor {
			return true
		}
		switch code {
		case CodeLoadType:
			if len(d) != 4 {
				return false
			}
			l.Type = binary.BigEndian.Uint32(d)
		case CodeLoadValue:
			if len(d) != 8 {
				return false
			}
			l.Value, hasValue = binary.BigEndian.Uint64(d), true
		case CodeSourceID:
			l.SourceID = d
		}
		return true
	})
	if !ok {
		return l, Malformed
	}
	if !hasValue || l.Value > MaxLoadValue || l.Type > LoadPeer {
		return l, BadLoad
	}
	return l, OK
}

// ParseSupported reads OC-Supported-Features' OC-Feature-Vector (0 when
// absent, which RFC 7683 §7.2 reads as the loss algorithm only).
func ParseSupported(data []byte) (features uint64, r Reason) {
	ok := walk(data, func(code uint32, vendor bool, d []byte) bool {
		if !vendor && code == CodeFeatureVector {
			if len(d) != 8 {
				return false
			}
			features = binary.BigEndian.Uint64(d)
		}
		return true
	})
	if !ok {
		return 0, Malformed
	}
	if features == 0 {
		features = FeatureLoss
	}
	return features, OK
}

// ours reports whether code is one of the AVPs an agent acting as the
// reacting node takes out of answers it relays.
func ours(code uint32) bool {
	return code == CodeOLR || code == CodeSupportedFeatures || code == CodeLoad
}

// AppendStripped appends to dst the AVPs of body (a message without its
// header) except OC-OLR, OC-Supported-Features and Load, as they are
// (padding included). body must be well formed (the agent scanned it).
func AppendStripped(dst, body []byte) []byte {
	for len(body) >= 8 {
		l := int(body[5])<<16 | int(body[6])<<8 | int(body[7])
		n := min((l+3)&^3, len(body))
		if n < 8 {
			break
		}
		if body[4]&0x80 != 0 || !ours(binary.BigEndian.Uint32(body)) {
			dst = append(dst, body[:n]...)
		}
		body = body[n:]
	}
	return dst
}

// loadValueAt is where EncodeLoad puts the Load-Value's 8 bytes: after the
// Load header (8), the Load-Type AVP (12) and the Load-Value header (8).
const loadValueAt = 28

// AppendLoad appends tmpl, a Load AVP from EncodeLoad, with its value set
// to v: the agent reports its load per answer without encoding anew.
func AppendLoad(dst, tmpl []byte, v uint64) []byte {
	n := len(dst)
	dst = append(dst, tmpl...)
	binary.BigEndian.PutUint64(dst[n+loadValueAt:], v)
	return dst
}
