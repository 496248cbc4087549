package diameteragent

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// From one downstream connection, Gx goes to the PCRF group and Gy to the
// OCS group; the Hop-by-Hop id is the agent's on the way up and the
// client's on the way back; End-to-End is kept; a Route-Record naming the
// client is appended.
func TestRoutesByRealmAndApplication(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	gx := c.call(req{app: diameter.AppGx, session: "gx;1", e2e: 11, hbh: 0x1234}.bytes(t))
	gy := c.call(req{app: diameter.AppGy, realm: "ocs.example", session: "gy;1", e2e: 12, hbh: 0x1235}.bytes(t))
	if gx.result != ResultSuccess || !strings.HasPrefix(gx.origin, "pcrf") || gx.hbh != 0x1234 || gx.e2e != 11 {
		t.Errorf("Gx answer from %s result %d hbh %#x e2e %d", gx.origin, gx.result, gx.hbh, gx.e2e)
	}
	if gy.result != ResultSuccess || !strings.HasPrefix(gy.origin, "ocs") || gy.hbh != 0x1235 || gy.e2e != 12 {
		t.Errorf("Gy answer from %s result %d hbh %#x", gy.origin, gy.result, gy.hbh)
	}
	up := h.srv[gx.origin].requests()
	if len(up) != 1 || up[0].hbh == 0x1234 || up[0].e2e != 11 || up[0].routeRecord != 1 {
		t.Fatalf("upstream saw %+v", up)
	}
	var rr []byte
	walkAVPs(up[0].raw[20:], func(code uint32, _ bool, d []byte) error {
		if code == 282 {
			rr = d
		}
		return nil
	})
	if string(rr) != "pgw1.example" {
		t.Errorf("Route-Record %q, want the client's identity", rr)
	}
}

// RFC 6733's answers for what cannot be routed, each with the agent's
// Origin-Host and, for 3xxx, the E bit.
func TestRoutingRefusals(t *testing.T) {
	cfg := baseConfig()
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	for _, tc := range []struct {
		name string
		r    req
		want uint32
	}{
		{"unknown realm", req{app: diameter.AppGx, realm: "nowhere.example", e2e: 1}, ResultRealmNotServed},
		{"served realm, other application", req{app: diameter.AppGy, realm: "pcrf.example", e2e: 2}, ResultUnableToDeliver},
		{"loop", req{app: diameter.AppGx, e2e: 3, routeRecords: []string{"pgw0.example", "DRA.example"}}, ResultLoopDetected},
		{"Destination-Host without Destination-Realm", req{app: diameter.AppGx, noRealm: true, destHost: "pcrf1.example", e2e: 4}, ResultUnableToDeliver},
		{"no Destination-Realm", req{app: diameter.AppGx, noRealm: true, e2e: 5}, ResultMissingAVP},
	} {
		a := c.call(tc.r.bytes(t))
		eBit := a.flags&diam.ErrorFlag != 0
		if a.result != tc.want || a.origin != "dra.example" || a.e2e != tc.r.e2e || eBit != (tc.want < 4000) || len(a.errMsg) == 0 {
			t.Errorf("%s: result %d origin %s e2e %d E %v msg %q; want %d", tc.name, a.result, a.origin, a.e2e, eBit, a.errMsg, tc.want)
		}
	}
	for host, s := range h.srv {
		if n := len(s.requests()); n != 0 {
			t.Errorf("%s received %d refused requests", host, n)
		}
	}
}

// A default group takes what no route matches, so no 3003.
func TestDefaultRoute(t *testing.T) {
	cfg := baseConfig()
	cfg.DefaultGroup = "ocs"
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	if a := c.call(req{app: 16777251, realm: "other.example", e2e: 1}.bytes(t)); a.result != ResultSuccess || !strings.HasPrefix(a.origin, "ocs") {
		t.Fatalf("answer %d from %s", a.result, a.origin)
	}
}

// Destination-Host is honoured while its peer is OKAY, across round robin;
// when that peer is down the request is routed by realm.
func TestDestinationHostHonouredWhileUp(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	for i := range 4 {
		if a := c.call(req{app: diameter.AppGx, destHost: "PCRF2.example", e2e: uint32(i + 1)}.bytes(t)); a.origin != "pcrf2.example" {
			t.Fatalf("request %d answered by %s", i, a.origin)
		}
	}
	h.srv["pcrf2.example"].conn.Close()
	h.waitState("pcrf2.example", StateDown)
	if a := c.call(req{app: diameter.AppGx, destHost: "pcrf2.example", e2e: 9}.bytes(t)); a.result != ResultSuccess || a.origin != "pcrf1.example" {
		t.Fatalf("with pcrf2 down: %d from %s", a.result, a.origin)
	}
}

// Round robin alternates; least_outstanding avoids the server holding
// requests.
func TestBalancingPolicies(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	seen := map[string]int{}
	for i := range 6 {
		seen[c.call(req{app: diameter.AppGx, e2e: uint32(i + 1)}.bytes(t)).origin]++
	}
	if seen["pcrf1.example"] != 3 || seen["pcrf2.example"] != 3 {
		t.Fatalf("round robin spread %v", seen)
	}

	cfg := baseConfig()
	cfg.Groups[0].Policy = LeastOutstanding
	h2 := newHarness(t, cfg)
	h2.start()
	c2 := h2.connect("pgw1.example")
	h2.srv["pcrf1.example"].setHold(true)
	h2.srv["pcrf2.example"].setHold(true)
	c2.send(req{app: diameter.AppGx, e2e: 1}.bytes(t))
	c2.send(req{app: diameter.AppGx, e2e: 2}.bytes(t))
	eventually(t, "two held", func() bool {
		return len(h2.srv["pcrf1.example"].requests())+len(h2.srv["pcrf2.example"].requests()) == 2
	})
	if n1, n2 := len(h2.srv["pcrf1.example"].requests()), len(h2.srv["pcrf2.example"].requests()); n1 != 1 || n2 != 1 {
		t.Fatalf("least outstanding: %d and %d", n1, n2)
	}
	h2.srv["pcrf2.example"].release() // pcrf1 keeps one pending
	c2.next()
	for i := range 3 {
		if a := c2.call(req{app: diameter.AppGx, e2e: uint32(10 + i)}.bytes(t)); a.origin != "pcrf2.example" {
			t.Fatalf("least outstanding sent request %d to %s", i, a.origin)
		}
	}
}

// latency_bucket sends new requests to the server in the lowest bucket
// of its answer latency (internal/latency, 32 ms wide): pcrf1, answering
// in 100 ms (bucket [64,128)), gets none while pcrf2 answers at once; when
// pcrf2 slows to 300 ms (bucket [256,512)), pcrf1 takes them.
func TestLatencyBucketPolicy(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[0].Policy = LatencyBucket
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	slow := func(host string, d time.Duration) { // one request answered d late
		s := h.srv[host]
		s.setHold(true)
		before := len(s.requests())
		c.send(req{app: diameter.AppGx, destHost: host, e2e: 100}.bytes(t))
		eventually(t, "held at "+host, func() bool { return len(s.requests()) > before })
		h.clock.Advance(d)
		s.release()
		if a := c.next(); a.origin != host {
			t.Fatalf("answer from %s, want %s", a.origin, host)
		}
	}
	slow("pcrf1.example", 100*time.Millisecond)
	from := func() map[string]int {
		seen := map[string]int{}
		for i := range 8 {
			seen[c.call(req{app: diameter.AppGx, e2e: uint32(200 + i)}.bytes(t)).origin]++
		}
		return seen
	}
	if seen := from(); seen["pcrf2.example"] != 8 {
		t.Fatalf("pcrf1 at 100 ms, pcrf2 at once: spread %v, want all on pcrf2", seen)
	}
	for range 30 { // the average (1/8 a sample) climbs past 256 ms
		slow("pcrf2.example", 300*time.Millisecond)
	}
	if seen := from(); seen["pcrf1.example"] != 8 {
		t.Fatalf("pcrf1 at 100 ms, pcrf2 at 300 ms: spread %v, want all on pcrf1", seen)
	}
}

func TestForwardedAppendsRouteRecord(t *testing.T) {
	m := req{app: diameter.AppGx, e2e: 1, session: "x"}.bytes(t)
	out := forwarded(m, "pgw7.example", nil)
	var in msgInfo
	if err := scan(out, "pgw7.EXAMPLE", &in); err != nil || !in.loop || in.routeRecords != 1 || !bytes.Equal(out[:4][1:], []byte{byte(len(out) >> 16), byte(len(out) >> 8), byte(len(out))}) {
		t.Fatalf("forwarded: %v loop %v records %d", err, in.loop, in.routeRecords)
	}
}
