package diameteragent

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// The agent's CER to a server carries its identity and applications.
func TestUpstreamCER(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	s := h.srv["ocs1.example"]
	s.mu.Lock()
	cer := s.got[0]
	s.mu.Unlock()
	if cer.cmd != cmdCER || cer.origin != "dra.example" || string(cer.in.originRealm) != "example.net" || len(cer.in.apps) != 2 {
		t.Fatalf("CER %+v", cer.in)
	}
}

// A hung server: one silent Tw brings a DWR, a second makes it SUSPECT
// (exactly at 2 × Tw after its last message) and fails its pending
// requests over; a third makes it DOWN and closes the connection. A
// message from it while SUSPECT makes it OKAY again.
func TestWatchdogSuspectDown(t *testing.T) {
	cfg := baseConfig()
	cfg.Watchdog = 10 * time.Second
	cfg.Groups[0].RequestTimeout = time.Minute // longer than 2 × Tw, or the requests time out first
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	p1, p2 := h.srv["pcrf1.example"], h.srv["pcrf2.example"]
	p1.setMute(true) // SIGSTOP
	for i := range 4 {
		c.send(req{app: diameter.AppGx, ccType: 1, session: "w" + string(rune('0'+i)), e2e: uint32(i + 1)}.bytes(t))
	}
	eventually(t, "two on each", func() bool { return len(p1.requests()) == 2 && p2.count(cmdCCR, false) == 0 && len(p2.requests()) == 2 })
	for range 2 {
		c.next() // pcrf2's
	}
	h.clock.Advance(10 * time.Second)
	eventually(t, "DWR to the hung server", func() bool { return p1.count(cmdDWR, true) == 1 })
	eventually(t, "DWR to the idle server", func() bool { return p2.count(cmdDWR, true) == 1 })
	u2 := h.peer("pcrf2.example")
	eventually(t, "its DWA in", func() bool { u2.mu.Lock(); defer u2.mu.Unlock(); return !u2.pendingDWR })
	h.clock.Advance(10*time.Second - time.Millisecond)
	if st := State(h.peer("pcrf1.example").state.Load()); st != StateOkay {
		t.Fatalf("%v before 2 × Tw", st)
	}
	h.clock.Advance(time.Millisecond)
	h.waitState("pcrf1.example", StateSuspect)
	for range 2 {
		if a := c.next(); a.result != ResultSuccess || a.origin != "pcrf2.example" {
			t.Fatalf("failed over: %d from %s", a.result, a.origin)
		}
	}
	retried := 0
	for _, m := range p2.requests() {
		if m.flags&diam.RetransmittedFlag != 0 {
			retried++
		}
	}
	if retried != 2 {
		t.Fatalf("%d requests with T at pcrf2, want 2", retried)
	}
	// SUSPECT is not routed to.
	for i := range 4 {
		if a := c.call(req{app: diameter.AppGx, e2e: uint32(20 + i)}.bytes(t)); a.origin != "pcrf2.example" {
			t.Fatalf("routed to %s while pcrf1 SUSPECT", a.origin)
		}
	}
	// Failback: any message from it makes it OKAY.
	p1.mu.Lock()
	var dwr message
	for _, m := range p1.got {
		if m.cmd == cmdDWR {
			dwr = m
		}
	}
	p1.mu.Unlock()
	p1.write(answerTo(t, dwr, ResultSuccess, "pcrf1.example"))
	h.waitState("pcrf1.example", StateOkay)
	// Hung again: DWR, SUSPECT, then DOWN with the connection closed.
	h.clock.Advance(10 * time.Second)
	h.clock.Advance(10 * time.Second)
	h.waitState("pcrf1.example", StateSuspect)
	h.clock.Advance(10 * time.Second)
	h.waitState("pcrf1.example", StateDown)
	if u := h.peer("pcrf1.example"); !strings.Contains(u.lastErr, "watchdog") {
		t.Fatalf("last error %q", u.lastErr)
	}
}

// A CEA whose Result-Code is not 2001 leaves the peer down, with the
// reason, and the agent tries again after the backoff.
func TestCEARefusedMarksDown(t *testing.T) {
	cfg := baseConfig()
	h := newHarness(t, cfg)
	h.srv["ocs2.example"].cea = ResultNoCommonApplication
	h.agent.Start()
	h.waitState("ocs1.example", StateOkay)
	u := h.peer("ocs2.example")
	eventually(t, "reason", func() bool { u.mu.Lock(); defer u.mu.Unlock(); return strings.Contains(u.lastErr, "5010") })
	if st := State(u.state.Load()); st == StateOkay {
		t.Fatal("OKAY after a refusing CEA")
	}
	h.clock.Advance(cfg.ReconnectMin + time.Second)
	eventually(t, "second CER", func() bool { return h.srv["ocs2.example"].count(cmdCER, true) == 2 })
	c := h.connect("pgw1.example")
	for i := range 3 {
		if a := c.call(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i + 1)}.bytes(t)); a.origin != "ocs1.example" {
			t.Fatalf("answered by %s", a.origin)
		}
	}
}

// Each server's CER offers the applications of its peer table entry (none
// listed: all of the agent's). A CEA sharing none of them leaves the server
// down with the reason (RFC 6733 §5.3) and it is not routed to; a CEA with
// the Relay id matches every application.
func TestPeerApplications(t *testing.T) {
	cfg := baseConfig()
	cfg.Peers[2].Applications = []uint32{diameter.AppGy} // ocs1
	cfg.Peers[3].Applications = []uint32{diameter.AppGy} // ocs2
	h := newHarness(t, cfg)
	h.srv["ocs2.example"].apps = []uint32{diameter.AppGx}
	h.srv["pcrf2.example"].apps = []uint32{relayApp}
	h.agent.Start()
	for _, host := range []string{"ocs1.example", "pcrf1.example", "pcrf2.example"} {
		h.waitState(host, StateOkay)
	}
	u := h.peer("ocs2.example")
	eventually(t, "ocs2 refused", func() bool { return strings.Contains(u.lastError(), "DIAMETER_NO_COMMON_APPLICATION") })
	if st := State(u.state.Load()); st == StateOkay {
		t.Fatalf("ocs2 %v with no application in common", st)
	}
	offered := func(host string) []uint32 {
		s := h.srv[host]
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, m := range s.got {
			if m.cmd == cmdCER && m.flags&diam.RequestFlag != 0 {
				return m.in.apps
			}
		}
		return nil
	}
	if got := offered("ocs1.example"); !slices.Equal(got, []uint32{diameter.AppGy}) {
		t.Errorf("CER to ocs1 offers %v, want [4]", got)
	}
	if got := offered("pcrf1.example"); !slices.Equal(got, []uint32{diameter.AppGx, diameter.AppGy}) {
		t.Errorf("CER to pcrf1 offers %v, want the agent's [16777238 4]", got)
	}
	c := h.connect("pgw1.example")
	for i := range 4 {
		if a := c.call(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i + 1)}.bytes(t)); a.origin != "ocs1.example" {
			t.Fatalf("Gy answered by %s", a.origin)
		}
	}
}

// A server that never answers the CER is given up on after Tw.
func TestNoCEA(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.srv["ocs2.example"].setMute(true)
	h.agent.Start()
	eventually(t, "CER sent", func() bool { return h.srv["ocs2.example"].count(cmdCER, true) == 1 })
	h.clock.Advance(30 * time.Second)
	u := h.peer("ocs2.example")
	eventually(t, "given up", func() bool { u.mu.Lock(); defer u.mu.Unlock(); return strings.Contains(u.lastErr, "no CEA") })
}

// A server's DPR is answered with a DPA; the peer goes DOWN, its pending
// requests fail over, and the agent reconnects after the backoff.
func TestUpstreamDPR(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[1].RequestTimeout = time.Minute
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	o1 := h.srv["ocs1.example"]
	o1.setHold(true)
	c.send(req{app: diameter.AppGy, realm: "ocs.example", e2e: 1}.bytes(t))
	c.send(req{app: diameter.AppGy, realm: "ocs.example", e2e: 2}.bytes(t))
	eventually(t, "one held at ocs1", func() bool { return len(o1.requests()) == 1 })
	if a := c.next(); a.origin != "ocs2.example" {
		t.Fatalf("answer from %s", a.origin)
	}
	id := Identity{OriginHost: "ocs1.example", OriginRealm: "ocs.example"}
	dpr, _ := buildDPR(&id, 0x99)
	o1.write(dpr)
	eventually(t, "DPA", func() bool { return o1.count(cmdDPR, false) == 1 })
	h.waitState("ocs1.example", StateDown)
	if a := c.next(); a.result != ResultSuccess || a.origin != "ocs2.example" {
		t.Fatalf("pending request after DPR: %d from %s", a.result, a.origin)
	}
	if u := h.peer("ocs1.example"); !strings.Contains(u.lastError(), "DPR") {
		t.Fatalf("last error %q", u.lastError())
	}
	o1.setHold(false)
	h.clock.Advance(time.Second)
	h.waitState("ocs1.example", StateReopen)
}
