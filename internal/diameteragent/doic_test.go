package diameteragent

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// withAVPs appends encoded AVPs to a message and fixes its length.
func withAVPs(msg []byte, avps ...[]byte) []byte {
	out := append([]byte(nil), msg...)
	for _, a := range avps {
		out = append(out, a...)
	}
	n := len(out)
	out[1], out[2], out[3] = byte(n>>16), byte(n>>8), byte(n)
	return out
}

// replyWith makes server s answer 2001 from its realm with avps() added.
func replyWith(t *testing.T, s *server, realm string, avps func() [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reply = func(m message) []byte {
		b, err := diameter.Refusal(m.in.info(), ResultSuccess, s.host, realm, "")
		if err != nil {
			t.Error(err)
		}
		return withAVPs(b, avps()...)
	}
}

func doicConfig() Config {
	cfg := baseConfig()
	cfg.DOIC = &DOIC{}
	return cfg
}

// sendNew sends n CCR-Is of new sessions and counts the answers by
// Result-Code and the requests each server got.
func sendNew(t *testing.T, h *harness, c *client, from, n int) (results map[uint32]int, got map[string]int) {
	t.Helper()
	before := map[string]int{}
	for host, s := range h.srv {
		before[host] = len(s.requests())
	}
	results = map[uint32]int{}
	for i := range n {
		r := c.call(req{app: diameter.AppGx, ccType: 1, session: fmt.Sprintf("pgw1;%d", from+i), e2e: uint32(from + i)}.bytes(t))
		results[r.result]++
	}
	got = map[string]int{}
	for host, s := range h.srv {
		got[host] = len(s.requests()) - before[host]
	}
	return results, got
}

// A PCRF's host report of 50 % valid 10 s: of the new sessions the group
// would send it, half go to the other PCRF; at expiry it gets its share
// again. A higher sequence number replaces the report, a lower one is
// ignored; a session bound to the reported PCRF is refused 3004 on the
// throttled requests.
func TestDOICHostReportDivertsWithinTheGroup(t *testing.T) {
	h := newHarness(t, doicConfig())
	h.start()
	c := h.connect("pgw1.example")
	olr := doic.EncodeOLR(doic.HostReport, 5, 50, 10*time.Second, "")
	replyWith(t, h.srv["pcrf1.example"], "pcrf.example", func() [][]byte { return [][]byte{olr} })
	sendNew(t, h, c, 0, 2) // one answer from pcrf1 brings the report
	res, got := sendNew(t, h, c, 100, 400)
	if res[ResultSuccess] != 400 || got["pcrf1.example"] != 100 || got["pcrf2.example"] != 300 {
		t.Fatalf("under a 50 %% report: results %v, pcrf1 %d pcrf2 %d; want all 2001, 100 and 300", res, got["pcrf1.example"], got["pcrf2.example"])
	}
	v := h.agent.View().DOIC
	if len(v.Reports) != 1 || v.Reports[0].Type != "host" || v.Reports[0].Name != "pcrf1.example" || v.Reports[0].Reduction != 50 {
		t.Fatalf("view: %+v", v.Reports)
	}
	// A lower sequence number is ignored, a higher one replaces.
	olr = doic.EncodeOLR(doic.HostReport, 4, 100, 10*time.Second, "")
	sendNew(t, h, c, 1000, 4)
	if r := h.agent.View().DOIC.Reports[0]; r.Reduction != 50 || r.Sequence != 5 {
		t.Fatalf("after a lower sequence: %+v", r)
	}
	if h.agent.View().DOIC.Ignored["stale"] == 0 {
		t.Fatal("stale report not counted")
	}
	olr = doic.EncodeOLR(doic.HostReport, 6, 100, 10*time.Second, "")
	sendNew(t, h, c, 2000, 4)
	if _, got := sendNew(t, h, c, 3000, 100); got["pcrf1.example"] != 0 {
		t.Fatalf("under a 100 %% report pcrf1 got %d", got["pcrf1.example"])
	}
	// At expiry pcrf1 has its share again.
	olr = nil
	h.clock.Advance(10 * time.Second)
	if _, got := sendNew(t, h, c, 4000, 100); got["pcrf1.example"] != 50 {
		t.Fatalf("after expiry pcrf1 got %d of 100, want 50", got["pcrf1.example"])
	}
}

func TestDOICBoundSessionAndRealmReport(t *testing.T) {
	h := newHarness(t, doicConfig())
	h.start()
	c := h.connect("pgw1.example")
	// Bind 10 sessions, then pcrf1 reports 100 %.
	sendNew(t, h, c, 0, 10)
	replyWith(t, h.srv["pcrf1.example"], "pcrf.example", func() [][]byte {
		return [][]byte{doic.EncodeOLR(doic.HostReport, 1, 100, 10*time.Second, "")}
	})
	for i := range 10 { // CCR-U on each: pcrf1's sessions answered 3004 after the report
		c.call(req{app: diameter.AppGx, ccType: 2, session: fmt.Sprintf("pgw1;%d", i), e2e: uint32(100 + i)}.bytes(t))
	}
	res := map[uint32]int{}
	for i := range 10 {
		r := c.call(req{app: diameter.AppGx, ccType: 2, session: fmt.Sprintf("pgw1;%d", i), e2e: uint32(200 + i)}.bytes(t))
		res[r.result]++
		if r.result == ResultTooBusy && (r.errMsg != defaultDOICMessage || r.origin != "dra.example") {
			t.Fatalf("refusal %+v", r)
		}
	}
	if res[ResultTooBusy] != 5 || res[ResultSuccess] != 5 {
		t.Fatalf("bound sessions under a 100 %% host report: %v, want 5 refused 3004 and 5 answered", res)
	}
	// A realm report of 40 % applies to every request for the realm.
	replyWith(t, h.srv["pcrf1.example"], "pcrf.example", func() [][]byte { return nil })
	replyWith(t, h.srv["pcrf2.example"], "pcrf.example", func() [][]byte {
		return [][]byte{doic.EncodeOLR(doic.RealmReport, 1, 40, 10*time.Second, "")}
	})
	h.clock.Advance(11 * time.Second)
	sendNew(t, h, c, 500, 2)
	res, _ = sendNew(t, h, c, 600, 100)
	if res[ResultTooBusy] != 40 || res[ResultSuccess] != 60 {
		t.Fatalf("under a 40 %% realm report: %v, want 40 refused", res)
	}
	if v := h.agent.View().DOIC; v.Throttled < 45 {
		t.Fatalf("throttled counted %d", v.Throttled)
	}
}

// Bad DOIC input is ignored with its reason counted, and the server stays
// up; a PEER report from a non-adjacent node is ignored.
func TestDOICBadInputIsCounted(t *testing.T) {
	h := newHarness(t, doicConfig())
	h.start()
	c := h.connect("pgw1.example")
	bad := [][]byte{
		doic.EncodeOLR(doic.HostReport, 1, 101, 10*time.Second, ""),
		doic.EncodeOLR(doic.HostReport, 1, 50, 86401*time.Second, ""),
		doic.EncodeOLR(doic.PeerReport, 1, 50, 10*time.Second, "elsewhere.example"),
		{0, 0, 2, 0x6f, 0, 0, 0, 20, 0, 0, 2, 0x70, 0, 0, 0, 40, 0, 0, 0, 0}, // OC-OLR whose inner AVP overruns it
		doic.EncodeLoad(doic.LoadHost, 70000, "pcrf1.example"),
	}
	replyWith(t, h.srv["pcrf1.example"], "pcrf.example", func() [][]byte { return bad })
	res, got := sendNew(t, h, c, 0, 20)
	if res[ResultSuccess] != 20 || got["pcrf1.example"] != 10 {
		t.Fatalf("results %v, pcrf1 %d", res, got["pcrf1.example"])
	}
	v := h.agent.View()
	for _, r := range []string{"reduction_over_100", "validity_over_86400", "peer_not_adjacent", "malformed", "bad_load"} {
		if v.DOIC.Ignored[r] != 10 {
			t.Errorf("ignored %s: %d, want 10", r, v.DOIC.Ignored[r])
		}
	}
	if len(v.DOIC.Reports) != 0 || v.Peers[0].State != "OKAY" || v.Peers[0].Load != nil {
		t.Fatalf("reports %v, pcrf1 %s load %v", v.DOIC.Reports, v.Peers[0].State, v.Peers[0].Load)
	}
}

// throttledDOIC is an agent with doic (report_realm as given) whose PCRF
// group has an egress rate of rate/s throttled by src: 40 % at a load of
// 60 % or more, a reversal hold of 7 s.
func throttledDOIC(t *testing.T, rate float64, reportRealm bool) (*harness, *fakeLoad) {
	src := &fakeLoad{}
	cfg := doicConfig()
	cfg.DOIC.ReportRealm = reportRealm
	ctl, err := ratelimit.NewDynamic([]ratelimit.Step{{AtLeast: 60, Throttle: 40}}, 50, 7*time.Second, 40)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Groups[0].Egress = ratelimit.NewProfile("pcrf", rule(t, "overall", rate), nil, 16)
	cfg.Groups[0].Dynamic = &Dynamic{Source: src, Interval: time.Second, Controller: ctl}
	h := newHarness(t, cfg)
	h.start()
	return h, src
}

// For a client without DOIC the agent advertises it upstream and takes the
// servers' DOIC AVPs out of the answer; every answer carries the agent's
// Load. A client with DOIC (peer reports) gets the agent's OC-Supported-
// Features and, while its group is throttled, a PEER report of the
// throttle with the agent as SourceID.
func TestDOICAdvertiseStripAndReport(t *testing.T) {
	h, src := throttledDOIC(t, 1000, true)
	for _, s := range []string{"pcrf1.example", "pcrf2.example"} {
		replyWith(t, h.srv[s], "pcrf.example", func() [][]byte {
			return [][]byte{doic.EncodeSupported(doic.FeatureLoss, ""), doic.EncodeLoad(doic.LoadPeer, 100, "")}
		})
	}
	c := h.connect("pgw1.example")
	a := c.call(req{app: diameter.AppGx, ccType: 1, session: "s;1", e2e: 1}.bytes(t))
	fwd := append(h.srv["pcrf1.example"].requests(), h.srv["pcrf2.example"].requests()...)
	if len(fwd) != 1 || !ocOf(fwd[0]).HasSupported {
		t.Fatalf("forwarded request without OC-Supported-Features: %+v", fwd)
	}
	if f, _ := doic.ParseSupported(ocOf(fwd[0]).Supported); f != ourFeatures {
		t.Fatalf("advertised features %x", f)
	}
	if ocOf(a).HasSupported || ocOf(a).NOLR != 0 || ocOf(a).NLoad != 1 {
		t.Fatalf("answer to a client without DOIC: %+v", ocOf(a))
	}
	if l, r := doic.ParseLoad(ocOf(a).Loads[0]); r != doic.OK || l.Type != doic.LoadPeer || string(l.SourceID) != "dra.example" {
		t.Fatalf("agent's load %+v %v", l, r)
	}
	if v := h.agent.View().Peers[1].Load; v == nil || *v != 100 || h.agent.View().Peers[0].Load != nil {
		t.Fatalf("pcrf2's load in the view: %v (the first request went to pcrf2)", v)
	}
	doicReq := func(e2e uint32) []byte {
		return withAVPs(req{app: diameter.AppGx, ccType: 1, session: fmt.Sprint("d;", e2e), e2e: e2e}.bytes(t),
			doic.EncodeSupported(doic.FeatureLoss|doic.FeaturePeerReport, ""))
	}
	a = c.call(doicReq(2))
	if !ocOf(a).HasSupported || ocOf(a).NOLR != 0 {
		t.Fatalf("unthrottled answer to a DOIC client: %+v", ocOf(a))
	}
	src.set(70, nil)
	h.clock.Advance(time.Second)
	a = c.call(doicReq(3))
	if ocOf(a).NOLR != 2 {
		t.Fatalf("throttled 40 %%: %d OC-OLRs in the answer, want a PEER and a REALM report", ocOf(a).NOLR)
	}
	peer, _ := doic.ParseOLR(ocOf(a).OLRs[0])
	realm, _ := doic.ParseOLR(ocOf(a).OLRs[1])
	if peer.Type != doic.PeerReport || peer.Reduction != 40 || peer.Validity != 7*time.Second || string(peer.SourceID) != "dra.example" ||
		realm.Type != doic.RealmReport || realm.Reduction != 40 {
		t.Fatalf("reports %+v %+v", peer, realm)
	}
	if g := h.agent.View().Groups[0].Report; g == nil || g.Reduction != 40 || g.Sequence != peer.Seq {
		t.Fatalf("group view report %+v", g)
	}
	// The throttle falls back: a newer report with validity 0 ends it.
	src.set(10, nil)
	h.clock.Advance(8 * time.Second)
	a = c.call(doicReq(4))
	end, _ := doic.ParseOLR(ocOf(a).OLRs[0])
	if ocOf(a).NOLR != 2 || end.Validity != 0 || end.Seq <= peer.Seq {
		t.Fatalf("after the reversal: %+v", end)
	}
	h.clock.Advance(8 * time.Second)
	if a = c.call(doicReq(5)); ocOf(a).NOLR != 0 {
		t.Fatal("an ended report still sent a validity later")
	}
}

// least_loaded: Load 10 000 and 60 000 split new sessions by headroom,
// 55 536 : 5 536.
func TestLeastLoadedProportion(t *testing.T) {
	cfg := doicConfig()
	cfg.Groups[0].Policy = LeastLoaded
	h := newHarness(t, cfg)
	h.start()
	for host, v := range map[string]uint64{"pcrf1.example": 10000, "pcrf2.example": 60000} {
		replyWith(t, h.srv[host], "pcrf.example", func() [][]byte { return [][]byte{doic.EncodeLoad(doic.LoadHost, v, host)} })
	}
	c := h.connect("pgw1.example")
	sendNew(t, h, c, 0, 20) // both report
	_, got := sendNew(t, h, c, 100, 1000)
	want := 1000 * 55536 / (55536 + 5536)
	if d := got["pcrf1.example"] - want; d < -5 || d > 5 {
		t.Fatalf("pcrf1 (load 10000) got %d of 1000, want %d ± 5", got["pcrf1.example"], want)
	}
}

// ocOf finds the DOIC and Load AVPs of a message a test peer saw.
func ocOf(m message) doic.Found {
	var f doic.Found
	doic.Scan(m.raw[20:], &f)
	return f
}
