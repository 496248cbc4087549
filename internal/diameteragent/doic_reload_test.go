package diameteragent

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
)

// A PEER report (RFC 8581) from the adjacent server applies to it; the
// reports in force survive a reload, and reacting to them allocates
// nothing; without doic the agent reacts to none and adds nothing.
func TestDOICPeerReportAndReload(t *testing.T) {
	h := newHarness(t, doicConfig())
	h.start()
	c := h.connect("pgw1.example")
	replyWith(t, h.srv["pcrf2.example"], "pcrf.example", func() [][]byte {
		return [][]byte{doic.EncodeOLR(doic.PeerReport, 1, 100, 10*time.Second, "PCRF2.example")}
	})
	sendNew(t, h, c, 0, 2)
	if _, got := sendNew(t, h, c, 100, 50); got["pcrf2.example"] != 0 || got["pcrf1.example"] != 50 {
		t.Fatalf("under pcrf2's 100 %% peer report: %v", got)
	}
	if err := h.agent.Update(doicConfig()); err != nil {
		t.Fatal(err)
	}
	if r := h.agent.View().DOIC.Reports; len(r) != 1 || r[0].Type != "peer" || r[0].Name != "pcrf2.example" {
		t.Fatalf("after a reload: %+v", r)
	}
	g := h.agent.gen.Load()
	gr, u := g.groups["pcrf"], g.peers["pcrf2.example"]
	now := h.clock.Now()
	if n := testing.AllocsPerRun(100, func() { h.agent.react(gr, u, []byte("pcrf.example"), false, now) }); n != 0 {
		t.Errorf("react: %.0f allocations", n)
	}
	if err := h.agent.Update(baseConfig()); err != nil {
		t.Fatal(err)
	}
	a := c.call(req{app: diameter.AppGx, ccType: 1, session: "plain;1", e2e: 900}.bytes(t))
	if _, got := sendNew(t, h, c, 1000, 20); got["pcrf2.example"] != 10 || h.agent.View().DOIC != nil {
		t.Fatalf("doic off: %v", got)
	}
	if ocOf(a).NLoad != 0 {
		t.Fatal("doic off: the agent added its Load")
	}
}

// A DOIC client's request refused by the throttled egress limit gets the
// agent's report in the refusal too; a client without DOIC gets a plain
// refusal.
func TestDOICReportInRefusals(t *testing.T) {
	h, src := throttledDOIC(t, 1, false)
	c := h.connect("pgw1.example")
	src.set(70, nil)
	h.clock.Advance(time.Second)
	var doicRefusal, plainRefusal message
	for i := range 10 {
		r := req{app: diameter.AppGx, ccType: 1, session: fmt.Sprint("r;", i), e2e: uint32(10 + i)}.bytes(t)
		if a := c.call(withAVPs(r, doic.EncodeSupported(doic.FeatureLoss|doic.FeaturePeerReport, ""))); a.result == ResultUnableToDeliver {
			doicRefusal = a
		}
		if a := c.call(req{app: diameter.AppGx, ccType: 1, session: fmt.Sprint("p;", i), e2e: uint32(100 + i)}.bytes(t)); a.result == ResultUnableToDeliver {
			plainRefusal = a
		}
	}
	f := ocOf(doicRefusal)
	if doicRefusal.result == 0 || !f.HasSupported || f.NOLR != 1 {
		t.Fatalf("refusal to the DOIC client: %+v, AVPs %+v", doicRefusal, f)
	}
	if o, r := doic.ParseOLR(f.OLRs[0]); r != doic.OK || o.Type != doic.PeerReport || o.Reduction != 40 {
		t.Fatalf("its report: %+v %v", o, r)
	}
	if pf := ocOf(plainRefusal); plainRefusal.result == 0 || pf.Any() {
		t.Fatalf("refusal to the client without DOIC: %+v", plainRefusal)
	}
}
