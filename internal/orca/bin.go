package orca

import (
	"encoding/base64"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// OrcaLoadReport's field numbers (xds/data/orca/v3/orca_load_report.proto).
const (
	protoCPU         = 1
	protoMem         = 2
	protoRPS         = 3 // deprecated uint64: skipped
	protoRequestCost = 4
	protoUtilization = 5
	protoRPSFrac     = 6
	protoEPS         = 7
	protoNamed       = 8
	protoApp         = 9
)

// parseBin reads the BIN form: base64 (padded or not) of a serialized
// OrcaLoadReport. The wire is walked with protowire, the protobuf module's
// own low-level codec (already in the module graph), so no generated types
// are needed: the xds proto package is not a dependency. As protobuf does,
// it skips fields it does not know (a newer report stays readable), and a
// repeated scalar takes the last value. proto3 does not put a zero scalar
// on the wire, so in this form a zero utilization reads as absent, as it
// does for gRPC.
func parseBin(s string, r *Report) Reason {
	var raw [MaxHeaderLen]byte // s fits: Parse checked its length
	src := raw[:copy(raw[:], s)]
	enc := base64.StdEncoding
	if len(src)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	var buf [MaxHeaderLen * 3 / 4]byte
	n, err := enc.Decode(buf[:], src)
	if err != nil {
		return ReasonBadBase64
	}
	b := buf[:n]
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return ReasonBadProto
		}
		b = b[l:]
		var why Reason
		switch {
		case typ == protowire.Fixed64Type && isScalar(num):
			v, l := protowire.ConsumeFixed64(b)
			if l < 0 {
				return ReasonBadProto
			}
			b = b[l:]
			why = r.setBinField(num, math.Float64frombits(v))
		case typ == protowire.BytesType && isMap(num):
			entry, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return ReasonBadProto
			}
			b = b[l:]
			why = r.binMapEntry(num, entry)
		default:
			l := protowire.ConsumeFieldValue(num, typ, b)
			if l < 0 {
				return ReasonBadProto
			}
			b = b[l:]
		}
		if why != ReasonOK {
			return why
		}
	}
	return ReasonOK
}

func isScalar(num protowire.Number) bool {
	switch num {
	case protoCPU, protoMem, protoRPSFrac, protoEPS, protoApp:
		return true
	}
	return false
}

func isMap(num protowire.Number) bool {
	return num == protoRequestCost || num == protoUtilization || num == protoNamed
}

// setBinField sets a scalar; unlike TEXT and JSON, a repeat is not an
// error on the wire (last one wins), so the field is cleared first.
func (r *Report) setBinField(num protowire.Number, v float64) Reason {
	var f Field
	switch num {
	case protoCPU:
		f = FieldCPU
	case protoMem:
		f = FieldMem
	case protoRPSFrac:
		f = FieldRPS
	case protoEPS:
		f = FieldEPS
	case protoApp:
		f = FieldApp
	}
	r.Has &^= f
	return r.setField(f, v)
}

// binMapEntry reads one map entry message (key = 1 string, value = 2
// double).
func (r *Report) binMapEntry(num protowire.Number, b []byte) Reason {
	var key []byte
	var val float64
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return ReasonBadProto
		}
		b = b[l:]
		switch {
		case n == 1 && typ == protowire.BytesType:
			key, l = protowire.ConsumeBytes(b)
		case n == 2 && typ == protowire.Fixed64Type:
			var v uint64
			v, l = protowire.ConsumeFixed64(b)
			val = math.Float64frombits(v)
		default:
			l = protowire.ConsumeFieldValue(n, typ, b)
		}
		if l < 0 {
			return ReasonBadProto
		}
		b = b[l:]
	}
	m := MapNamed
	switch num {
	case protoUtilization:
		m = MapUtilization
	case protoRequestCost:
		m = MapRequestCost
	}
	if len(key) == 0 || len(key) > MaxNameLen {
		return ReasonBadName // checked before the copy string() makes
	}
	return r.addMetric(m, string(key), val)
}
