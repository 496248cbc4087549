package diameteragent

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// The agent answers a downstream CER with its own identity and the
// applications it routes, a DWR with a DWA, a second CER with 5012 (the
// connection stays), and a DPR with a DPA, then closes.
func TestDownstreamPeerExchanges(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	a, b := net.Pipe()
	c := &client{t: t, host: "pgw1.example", conn: a, answers: make(chan message, 16), reqs: make(chan message, 1), done: make(chan error, 1)}
	go func() { c.done <- h.agent.Serve(b) }()
	go c.read()
	id := Identity{OriginHost: "pgw1.example", OriginRealm: "example.net"}
	cer, _ := buildCER(&id, []Application{{ID: diameter.AppGy}}, 7)
	cea := c.call(cer)
	var ip netip.Addr
	walkAVPs(cea.raw[20:], func(code uint32, _ bool, data []byte) error {
		if code == 257 && len(data) == 6 {
			ip, _ = netip.AddrFromSlice(data[2:])
		}
		return nil
	})
	if cea.result != ResultSuccess || cea.origin != "dra.example" || cea.hbh != 7 || ip.String() != "192.0.2.1" ||
		!slices.Contains(cea.in.apps, diameter.AppGx) || !slices.Contains(cea.in.apps, diameter.AppGy) {
		t.Fatalf("CEA: result %d origin %s hbh %d ip %v apps %v", cea.result, cea.origin, cea.hbh, ip, cea.in.apps)
	}
	dwr, _ := buildDWR(&id, 8)
	if dwa := c.call(dwr); dwa.cmd != cmdDWR || dwa.result != ResultSuccess || dwa.hbh != 8 {
		t.Fatalf("DWA %+v", dwa)
	}
	again, _ := buildCER(&id, []Application{{ID: diameter.AppGy}}, 9)
	if a2 := c.call(again); a2.cmd != cmdCER || a2.result != ResultUnableToComply {
		t.Fatalf("second CER answered %d", a2.result)
	}
	// Still routing after the refused CER.
	if ans := c.call(req{app: diameter.AppGx, session: "s1", e2e: 1}.bytes(t)); ans.result != ResultSuccess {
		t.Fatalf("request after a second CER: %d", ans.result)
	}
	dpr, _ := buildDPR(&id, 10)
	if dpa := c.call(dpr); dpa.cmd != cmdDPR || dpa.result != ResultSuccess {
		t.Fatalf("DPA %+v", dpa)
	}
	if err := <-c.done; err != nil {
		t.Fatalf("Serve after DPR: %v", err)
	}
}

// A CER sharing no application gets 5010 and the connection ends; a first
// message that is not a CER ends it at once.
func TestDownstreamCapabilitiesRefused(t *testing.T) {
	h := newHarness(t, baseConfig())
	a, b := net.Pipe()
	c := &client{t: t, conn: a, answers: make(chan message, 4), reqs: make(chan message, 1)}
	done := make(chan error, 1)
	go func() { done <- h.agent.Serve(b) }()
	go c.read()
	id := Identity{OriginHost: "pgw9.example", OriginRealm: "example.net"}
	cer, _ := buildCER(&id, []Application{{ID: 16777251}}, 1)
	if cea := c.call(cer); cea.result != ResultNoCommonApplication {
		t.Fatalf("CEA %d", cea.result)
	}
	if err := <-done; err == nil {
		t.Fatal("Serve returned no error")
	}
	a2, b2 := net.Pipe()
	go func() { done <- h.agent.Serve(b2) }()
	go a2.Write(req{app: diameter.AppGx, e2e: 1}.bytes(t))
	if err := <-done; err == nil {
		t.Fatal("a CCR before the CER was served")
	}
	a2.Close()
}

// A peer that is refused and never reads the refusal does not hold Serve:
// the connection closes Tw later.
func TestRefusedPeerThatDoesNotRead(t *testing.T) {
	h := newHarness(t, baseConfig())
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan error, 1)
	go func() { done <- h.agent.Serve(b) }()
	id := Identity{OriginHost: "pgw9.example", OriginRealm: "example.net"}
	cer, _ := buildCER(&id, []Application{{ID: 16777251}}, 1)
	a.Write(cer) // and never read the CEA
	select {
	case <-done:
		t.Fatal("Serve returned before the grace time")
	case <-time.After(20 * time.Millisecond):
	}
	h.clock.Advance(30 * time.Second)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still holds the connection after Tw")
	}
}

// A message longer than max_length ends the connection.
func TestDownstreamMessageTooLong(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxLength = 1024
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	big := req{app: diameter.AppGx, session: strings.Repeat("x", 2000), e2e: 1}.bytes(t)
	go c.conn.Write(big)
	if err := <-c.done; err == nil || !errors.Is(err, diameter.ErrMalformed) {
		t.Fatalf("Serve: %v", err)
	}
}

// Close disconnects every peer with a DPR, upstream and downstream
// (RFC 6733 §5.4), and returns once they are written.
func TestCloseSendsDPR(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	go func() {
		for range c.answers { // the pipe is unbuffered: the DPR is read
		}
	}()
	h.agent.Close()
	for host, s := range h.srv {
		eventually(t, host+" DPR", func() bool { return s.count(cmdDPR, true) == 1 })
	}
	select {
	case m := <-c.reqs:
		if m.cmd != cmdDPR || m.origin != "dra.example" {
			t.Fatalf("downstream got command %d from %s, want a DPR from dra.example", m.cmd, m.origin)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no DPR downstream")
	}
}
