package diameteragent

import (
	"testing"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// FuzzScan: any bytes either fail to scan or scan to fields within the
// message; a scanned request, forwarded, scans again with the same fields
// and one more Route-Record, which the loop check sees.
func FuzzScan(f *testing.F) {
	id := Identity{OriginHost: "pgw1.example", OriginRealm: "example.net"}
	cer, _ := buildCER(&id, []Application{{ID: diameter.AppGx, VendorID: 10415}, {ID: 4}}, 1)
	f.Add(cer)
	f.Add(req{app: diameter.AppGx, ccType: 1, session: "s;1", destHost: "pcrf1.example", e2e: 1}.bytes(f))
	f.Add(req{app: 4, routeRecords: []string{"a", "dra.example"}, e2e: 2}.bytes(f))
	var in msgInfo
	_ = scan(cer, "", &in)
	cea, _ := buildAnswer(&in, &id, []Application{{ID: 4}}, ResultSuccess, "")
	f.Add(cea)
	f.Fuzz(func(t *testing.T, b []byte) {
		var in msgInfo
		in.wantApps = true
		if err := scan(b, "dra.example", &in); err != nil {
			return
		}
		if !in.request {
			return
		}
		out := forwarded(b, "dra.example")
		var again msgInfo
		if err := scan(out, "dra.example", &again); err != nil {
			t.Fatalf("forwarded message does not scan: %v", err)
		}
		if !again.loop || again.routeRecords != in.routeRecords+1 || string(again.sessionID) != string(in.sessionID) ||
			string(again.destRealm) != string(in.destRealm) || again.hdr.HopByHopID != in.hdr.HopByHopID ||
			again.hdr.CommandCode != in.hdr.CommandCode || int(again.hdr.MessageLength) != len(out) {
			t.Fatalf("forwarded differs: %+v vs %+v", again, in)
		}
	})
}
