package diameteragent

import (
	"encoding/binary"
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
		out := forwarded(b, "dra.example", nil)
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

// quietLink is a link with no writer: what is sent stays in its queue.
func quietLink() *link {
	return &link{conn: discardConn{}, out: make(chan []byte, outboxSize), done: make(chan struct{}), pending: map[uint32]*pending{}}
}

func drain(l *link) (msgs [][]byte) {
	for {
		select {
		case m := <-l.out:
			msgs = append(msgs, m)
		default:
			return msgs
		}
	}
}

// FuzzRoute: any request the agent reads is either answered by the agent
// at once (one answer, the sender's Hop-by-Hop and End-to-End ids) or
// forwarded to exactly one server (one request, pending there); the
// server's answer then reaches the sender once, and nothing stays pending.
// DOIC is on: the request comes back as its own answer, so whatever
// DOIC and Load AVPs the input holds are read as a server's, and the
// answer relayed (stripped, the agent's added) must still be well formed.
func FuzzRoute(f *testing.F) {
	for _, r := range []req{
		{app: diameter.AppGx, ccType: 1, session: "s;1", e2e: 1},
		{app: diameter.AppGy, realm: "ocs.example", ccType: 3, session: "s;2", e2e: 2},
		{app: diameter.AppGx, destHost: "pcrf2.example", e2e: 3},
		{app: diameter.AppGx, realm: "nowhere", e2e: 4},
		{app: diameter.AppGx, noRealm: true, e2e: 5},
		{app: diameter.AppGx, routeRecords: []string{"dra.example"}, e2e: 6},
	} {
		f.Add(r.bytes(f))
	}
	cfg := baseConfig()
	cfg.DOIC = &DOIC{}
	a, err := New(cfg, Options{Clock: newFakeClock()})
	if err != nil {
		f.Fatal(err)
	}
	ups := map[*link]bool{}
	for _, u := range a.gen.Load().peers {
		l := quietLink()
		ups[l] = true
		u.link.Store(l)
		u.setState(StateOkay)
	}
	d := &downstream{host: "pgw1.example", link: quietLink()}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in msgInfo
		if scan(b, "dra.example", &in) != nil || !in.request || in.base() {
			return
		}
		hbh, e2e := in.hdr.HopByHopID, in.hdr.EndToEndID
		a.route(d, b, &in)
		answers := drain(d.link)
		var fwd [][]byte
		var at *link
		for l := range ups {
			if m := drain(l); len(m) > 0 {
				fwd, at = append(fwd, m...), l
			}
		}
		switch {
		case len(answers) == 1 && len(fwd) == 0:
			if hopByHop(answers[0]) != hbh || binary.BigEndian.Uint32(answers[0][16:20]) != e2e {
				t.Fatal("the agent's answer does not match the request")
			}
			return
		case len(answers) != 0 || len(fwd) != 1:
			t.Fatalf("%d answers and %d forwarded for one request", len(answers), len(fwd))
		}
		ans := append([]byte(nil), fwd[0]...)
		ans[4] &^= 0x80
		var ain msgInfo
		if err := scan(ans, "dra.example", &ain); err != nil {
			t.Fatalf("the forwarded request does not scan: %v", err)
		}
		var from *upstream
		for _, u := range a.gen.Load().peers {
			if u.link.Load() == at {
				from = u
			}
		}
		if ain.hasOC {
			a.readReports(from, ans, &ain)
		}
		a.answered(at, ans, &ain)
		back := drain(d.link)
		if len(back) != 1 || hopByHop(back[0]) != hbh {
			t.Fatalf("%d answers back", len(back))
		}
		var bin msgInfo
		if err := scan(back[0], "", &bin); err != nil {
			t.Fatalf("the relayed answer does not scan: %v", err)
		}
		for _, g := range a.gen.Load().groups {
			if g.st.pending.Load() != 0 {
				t.Fatalf("group %s: %d pending", g.Name, g.st.pending.Load())
			}
		}
	})
}
