package doic

import (
	"testing"
	"time"
)

// FuzzAnswer feeds arbitrary message bodies to what the agent does with an
// answer's bytes: nothing may panic, and what is taken obeys the limits.
func FuzzAnswer(f *testing.F) {
	f.Add(cca(f))
	f.Add(cca(f, EncodeOLR(HostReport, 1, 50, 10*time.Second, "")))
	f.Add(cca(f, EncodeOLR(PeerReport, 9, 100, MaxValidity, "dra.example"), EncodeLoad(LoadPeer, 65535, "x")))
	f.Add(EncodeSupported(FeatureLoss, "a"))
	f.Fuzz(func(t *testing.T, body []byte) {
		now := time.Unix(0, 0)
		tb := NewTable(4)
		var fd Found
		Scan(body, &fd)
		for _, d := range fd.OLRs[:fd.NOLR] {
			o, r := ParseOLR(d)
			if r != OK {
				continue
			}
			if o.Reduction > 100 || o.Validity > MaxValidity || o.Type >= numTypes {
				t.Fatalf("accepted %+v", o)
			}
			tb.Apply([]byte("h"), o, now)
		}
		for _, d := range fd.Loads[:fd.NLoad] {
			if l, r := ParseLoad(d); r == OK && l.Value > MaxLoadValue {
				t.Fatalf("accepted load %+v", l)
			}
		}
		if fd.HasSupported {
			ParseSupported(fd.Supported)
		}
	})
}
