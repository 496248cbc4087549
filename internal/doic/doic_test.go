package doic

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

func u32(code uint32, v uint32) *diam.AVP { return diam.NewAVP(code, 0, 0, datatype.Unsigned32(v)) }
func u64(code uint32, v uint64) *diam.AVP { return diam.NewAVP(code, 0, 0, datatype.Unsigned64(v)) }

func olrData(t testing.TB, avps ...*diam.AVP) []byte {
	b := serialize(diam.NewAVP(CodeOLR, 0, 0, &diam.GroupedAVP{AVP: avps}))
	return b[8:]
}

func TestParseOLR(t *testing.T) {
	seq, host := u64(CodeSequenceNumber, 7), diam.NewAVP(CodeReportType, 0, 0, datatype.Enumerated(0))
	tests := []struct {
		name string
		data []byte
		want Reason
		olr  OLR
	}{
		{"full", olrData(t, seq, host, u32(CodeReductionPercent, 50), u32(CodeValidityDuration, 10)), OK,
			OLR{Seq: 7, Type: HostReport, Reduction: 50, Validity: 10 * time.Second}},
		{"defaults", olrData(t, seq, diam.NewAVP(CodeReportType, 0, 0, datatype.Enumerated(1))), OK,
			OLR{Seq: 7, Type: RealmReport, Validity: DefaultValidity}},
		{"reduction 101", olrData(t, seq, host, u32(CodeReductionPercent, 101)), ReductionOver100, OLR{}},
		{"validity 86401", olrData(t, seq, host, u32(CodeValidityDuration, 86401)), ValidityOver86400, OLR{}},
		{"validity 86400", olrData(t, seq, host, u32(CodeValidityDuration, 86400)), OK,
			OLR{Seq: 7, Validity: MaxValidity}},
		{"no sequence", olrData(t, host), NoSequence, OLR{}},
		{"no type", olrData(t, seq), NoReportType, OLR{}},
		{"type 3", olrData(t, seq, diam.NewAVP(CodeReportType, 0, 0, datatype.Enumerated(3))), BadReportType, OLR{}},
		{"sequence of 4 bytes", olrData(t, u32(CodeSequenceNumber, 1), host), Malformed, OLR{}},
		{"inner length past the end", func() []byte {
			b := olrData(t, seq, host)
			b[7] = 200
			return b
		}(), Malformed, OLR{}},
		{"truncated", olrData(t, seq, host)[:5], Malformed, OLR{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, r := ParseOLR(tc.data)
			if r != tc.want {
				t.Fatalf("reason %v, want %v", r, tc.want)
			}
			if r == OK && (o.Seq != tc.olr.Seq || o.Type != tc.olr.Type || o.Reduction != tc.olr.Reduction || o.Validity != tc.olr.Validity) {
				t.Fatalf("got %+v, want %+v", o, tc.olr)
			}
		})
	}
}

func TestParseLoad(t *testing.T) {
	good := EncodeLoad(LoadHost, 60000, "pcrf1.example")[8:]
	if l, r := ParseLoad(good); r != OK || l.Value != 60000 || l.Type != LoadHost || string(l.SourceID) != "pcrf1.example" {
		t.Fatalf("got %+v %v", l, r)
	}
	if _, r := ParseLoad(EncodeLoad(LoadHost, 65536, "x")[8:]); r != BadLoad {
		t.Fatalf("value 65536: %v, want bad_load", r)
	}
	if _, r := ParseLoad(EncodeLoad(2, 1, "x")[8:]); r != BadLoad {
		t.Fatalf("type 2: %v, want bad_load", r)
	}
	noValue := serialize(diam.NewAVP(CodeLoad, 0, 0, &diam.GroupedAVP{AVP: []*diam.AVP{u32(CodeLoadType, 1)}}))[8:]
	if _, r := ParseLoad(noValue); r != BadLoad {
		t.Fatalf("no value: %v, want bad_load", r)
	}
	// A Load-Value of 4 bytes (go-diameter's Unsigned32 reading of it) is malformed.
	short := serialize(diam.NewAVP(CodeLoad, 0, 0, &diam.GroupedAVP{AVP: []*diam.AVP{u32(CodeLoadValue, 1)}}))[8:]
	if _, r := ParseLoad(short); r != Malformed {
		t.Fatalf("4-byte value: %v, want malformed", r)
	}
}

func TestSequenceAndExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := NewTable(0)
	host := []byte("PCRF1.example")
	apply := func(seq uint64, red uint32, valid time.Duration) Reason {
		r, _ := tb.Apply(host, OLR{Seq: seq, Type: HostReport, Reduction: red, Validity: valid}, now)
		return r
	}
	if r := apply(5, 50, 10*time.Second); r != OK {
		t.Fatal(r)
	}
	get := func() *Report { return tb.Lookup(HostReport, []byte("pcrf1.example"), now) }
	if r := get(); r == nil || r.Reduction != 50 {
		t.Fatalf("report %+v, want 50 %%", r)
	}
	if r := apply(4, 90, 10*time.Second); r != Stale || get().Reduction != 50 {
		t.Fatalf("lower sequence: %v, reduction %d", r, get().Reduction)
	}
	if r := apply(5, 90, 10*time.Second); r != OK || get().Reduction != 50 {
		t.Fatalf("equal sequence changed the report: %d", get().Reduction)
	}
	if r := apply(6, 30, 10*time.Second); r != OK || get().Reduction != 30 {
		t.Fatalf("higher sequence: %v, reduction %d", r, get().Reduction)
	}
	if tb.Lookup(RealmReport, []byte("pcrf1.example"), now) != nil {
		t.Fatal("a host report applies as a realm report")
	}
	now = now.Add(10*time.Second - time.Nanosecond)
	if get() == nil {
		t.Fatal("expired early")
	}
	now = now.Add(time.Nanosecond)
	if get() != nil {
		t.Fatal("in force after its validity")
	}
	now = now.Add(-time.Second)
	if r := apply(7, 0, 10*time.Second); r != OK || get() != nil {
		t.Fatal("reduction 0 did not end the report")
	}
	if tb.Ignored(Stale) != 1 {
		t.Fatalf("stale counted %d, want 1", tb.Ignored(Stale))
	}
}

func TestLossAlgorithmIsExact(t *testing.T) {
	for _, p := range []uint32{0, 1, 33, 40, 50, 99, 100} {
		r := &Report{Reduction: p}
		n := 0
		for range 1000 {
			if r.Throttle() {
				n++
			}
		}
		if n != int(p)*10 {
			t.Errorf("reduction %d: %d of 1000 throttled", p, n)
		}
		// Evenly spread: no 10 in a row hold more than p/10+1.
		r = &Report{Reduction: p}
		var w []bool
		for range 300 {
			w = append(w, r.Throttle())
		}
		for i := 0; i+10 <= len(w); i++ {
			c := 0
			for _, x := range w[i : i+10] {
				if x {
					c++
				}
			}
			if c > int(p)/10+1 {
				t.Fatalf("reduction %d: %d throttled in a window of 10", p, c)
			}
		}
	}
}

func TestTableBound(t *testing.T) {
	now := time.Unix(0, 0)
	tb := NewTable(2)
	for i, h := range []string{"a", "b", "c"} {
		r, _ := tb.Apply([]byte(h), OLR{Seq: 1, Type: HostReport, Reduction: 10, Validity: time.Duration(i+1) * time.Second}, now)
		if want := map[bool]Reason{true: TableFull, false: OK}[i == 2]; r != want {
			t.Fatalf("%s: %v, want %v", h, r, want)
		}
	}
	// Once one expires, a new one fits.
	if r, _ := tb.Apply([]byte("c"), OLR{Seq: 1, Type: HostReport, Reduction: 10, Validity: time.Second}, now.Add(time.Second)); r != OK {
		t.Fatalf("after expiry: %v", r)
	}
	if tb.Ignored(TableFull) != 1 {
		t.Fatal("table_full not counted")
	}
}

// A message with every AVP of ours, encoded by this package and decoded by
// go-diameter with the project dictionary: Load-Value is Unsigned64.
func TestDictionaryDecodesOurAVPs(t *testing.T) {
	if err := LoadDictionary(); err != nil {
		t.Fatal(err)
	}
	m := diam.NewMessage(272, 0, 16777238, 1, 1, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("s;1"))
	raw, err := m.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	extra := append(append(EncodeLoad(LoadHost, 60000, "pcrf1.example"), EncodeOLR(PeerReport, 3, 40, 30*time.Second, "dra.example")...),
		EncodeSupported(FeatureLoss|FeaturePeerReport, "dra.example")...)
	raw = append(raw, extra...)
	binary.BigEndian.PutUint32(raw[0:4], uint32(len(raw)))
	raw[0] = 1
	got, err := diam.ReadMessage(bytes.NewReader(raw), dict.Default)
	if err != nil {
		t.Fatal(err)
	}
	a, err := got.FindAVP("Load-Value", 0)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := a.Data.(datatype.Unsigned64); !ok || v != 60000 {
		t.Fatalf("Load-Value decoded as %T %v", a.Data, a.Data)
	}
	if _, err := got.FindAVP("SourceID", 0); err != nil {
		t.Fatal(err)
	}
	var f Found
	if !Scan(raw[20:], &f) || f.NLoad != 1 || f.NOLR != 1 || !f.HasSupported {
		t.Fatalf("scan found %+v", f)
	}
	if o, r := ParseOLR(f.OLRs[0]); r != OK || o.Type != PeerReport || string(o.SourceID) != "dra.example" || o.Reduction != 40 {
		t.Fatalf("OLR %+v %v", o, r)
	}
	if fv, r := ParseSupported(f.Supported); r != OK || fv != FeatureLoss|FeaturePeerReport {
		t.Fatalf("features %x %v", fv, r)
	}
}

func TestAppendLoadAndStripped(t *testing.T) {
	tmpl := EncodeLoad(LoadPeer, 0, "dra.example")
	b := AppendLoad([]byte{1, 2}, tmpl, 4242)
	if l, r := ParseLoad(b[2+8:]); r != OK || l.Value != 4242 || l.Type != LoadPeer {
		t.Fatalf("patched load %+v %v", l, r)
	}
	plain := cca(t)
	with := cca(t, EncodeOLR(HostReport, 1, 50, time.Second, ""), EncodeSupported(FeatureLoss, ""), EncodeLoad(LoadHost, 1, "x"))
	if got := AppendStripped(nil, with); !bytes.Equal(got, plain) {
		t.Fatalf("stripped %d bytes, want the %d without ours", len(got), len(plain))
	}
}

// The values on the wire are the RFCs' (IANA's AAA registry as Wireshark's
// Diameter dictionary and Erlang/OTP's doic_rfc7683.dia carry them; the
// README's DOIC section lists the sources), and the dictionary the agent
// loads names them alike.
func TestWireValuesOfTheRFCs(t *testing.T) {
	codes := map[string][2]uint32{
		"OC-Supported-Features": {CodeSupportedFeatures, 621}, "OC-Feature-Vector": {CodeFeatureVector, 622},
		"OC-OLR": {CodeOLR, 623}, "OC-Sequence-Number": {CodeSequenceNumber, 624},
		"OC-Validity-Duration": {CodeValidityDuration, 625}, "OC-Report-Type": {CodeReportType, 626},
		"OC-Reduction-Percentage": {CodeReductionPercent, 627}, "OC-Peer-Algo": {CodePeerAlgo, 648},
		"SourceID": {CodeSourceID, 649}, "Load": {CodeLoad, 650}, "Load-Type": {CodeLoadType, 651},
		"Load-Value": {CodeLoadValue, 652},
	}
	if err := LoadDictionary(); err != nil {
		t.Fatal(err)
	}
	for name, c := range codes {
		if c[0] != c[1] {
			t.Errorf("%s: code %d, want %d", name, c[0], c[1])
		}
		if a, err := dict.Default.FindAVP(0, name); err != nil || a.Code != c[1] {
			t.Errorf("%s in the dictionary: %+v %v", name, a, err)
		}
	}
	if HostReport != 0 || RealmReport != 1 || PeerReport != 2 || LoadHost != 0 || LoadPeer != 1 ||
		FeatureLoss != 0x1 || FeaturePeerReport != 0x10 {
		t.Errorf("report types %d %d %d, load types host %d peer %d, features %#x %#x",
			HostReport, RealmReport, PeerReport, LoadHost, LoadPeer, FeatureLoss, FeaturePeerReport)
	}
	for _, c := range []struct {
		avp  string
		code int
		name string
	}{{"OC-Report-Type", 0, "HOST_REPORT"}, {"OC-Report-Type", 2, "PEER_REPORT"}, {"Load-Type", 0, "HOST"}, {"Load-Type", 1, "PEER"}} {
		a, err := dict.Default.FindAVP(0, c.avp)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, it := range a.Data.Enum {
			if int(it.Code) == c.code {
				got = it.Name
			}
		}
		if got != c.name {
			t.Errorf("%s %d named %q in the dictionary, want %s", c.avp, c.code, got, c.name)
		}
	}
	// On the wire: a HOST load carries Load-Type 0.
	b := EncodeLoad(LoadHost, 1, "")
	if lt := binary.BigEndian.Uint32(b[8+8 : 8+12]); lt != 0 {
		t.Errorf("a HOST load's Load-Type on the wire: %d", lt)
	}
}
