package dashboard_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// diameterPeer is a downstream client of the agent on one connection,
// sending one request at a time.
type diameterPeer struct {
	t    *testing.T
	conn net.Conn
	fr   *diameter.Framer
	host string
	hbh  uint32
}

// dialDiameter connects to the agent as host and exchanges capabilities.
func dialDiameter(t *testing.T, addr, host string) *diameterPeer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &diameterPeer{t: t, conn: c, fr: diameter.NewFramer(c, 0, 1<<16), host: host}
	cer := diam.NewRequest(diameter.CmdCapabilitiesExchange, 0, dict.Default)
	diameter.AddCapabilities(cer, host, "pgw.example", "pgw")
	if rc := p.call(cer); rc != diam.Success {
		t.Fatalf("%s: CEA Result-Code %d", host, rc)
	}
	return p
}

// call sends m and returns its answer's Result-Code.
func (p *diameterPeer) call(m *diam.Message) uint32 {
	p.t.Helper()
	p.hbh++
	m.Header.HopByHopID, m.Header.EndToEndID = p.hbh, p.hbh
	p.conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := m.WriteTo(p.conn); err != nil {
		p.t.Fatal(err)
	}
	msg, err := p.fr.Next()
	if err != nil {
		p.t.Fatalf("%s: no answer: %v", p.host, err)
	}
	a, err := diam.ReadMessage(bytes.NewReader(msg), dict.Default)
	if err != nil {
		p.t.Fatal(err)
	}
	rc, err := a.FindAVP(avp.ResultCode, 0)
	if err != nil {
		p.t.Fatalf("%s: an answer without Result-Code: %v", p.host, a)
	}
	return uint32(rc.Data.(datatype.Unsigned32))
}

// ccrI opens a Gx session.
func (p *diameterPeer) ccrI(session string) uint32 {
	m := diam.NewMessage(diameter.CmdCreditControl, diam.RequestFlag|diam.ProxiableFlag, diameter.AppGx, 0, 0, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(session))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(p.host))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("pgw.example"))
	m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity("operator.example"))
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGx))
	m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(1))
	m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
	return p.call(m)
}

// TestDiameterAgentPanelInChromium: bin/caddy as a Diameter agent with two
// PCRFs, one a testpeer process and one an address that refuses, and the
// dashboard. After Gx sessions from two pGWs, some refused by the group's
// egress limit, the panel's peer table shows pcrf1 OKAY with its watchdog
// and answer latency and pcrf2 in its state (as the admin view names it)
// with the refused connection as its last error; the route, the group's counts and the bindings are the admin
// view's; pcrf1's DOIC report (host, 20 %) and Load (12345) and the DOIC
// counts are shown; a pGW named with markup is shown as text; the latency and
// requests charts get points; nothing overflows its box at 1280 px; the
// page requests nothing else.
func TestDiameterAgentPanelInChromium(t *testing.T) {
	e2e.SkipShort(t)
	pcrf1, stats := e2e.Addr(t), e2e.Addr(t)
	peer := e2e.Start(t, "pcrf1", e2e.Bin(t, "testpeer"), nil, "-listen", stats, "-name", "pcrf1.example",
		"-diameter", pcrf1, "-realm", "operator.example")
	peer.WaitTCP(t, pcrf1)
	pcrf2 := e2e.Addr(t) // nothing listens
	redis, redisAddr := e2e.StartRedis(t)
	dash, agent := e2e.Addr(t), e2e.Addr(t)
	dra := e2e.DiameterAgent{Listen: agent, Head: `
					application 16777238 vendor 10415
`,
		Peers: []string{"pcrf1.example", "pcrf2.example"},
		Addrs: map[string]string{"pcrf1.example": pcrf1, "pcrf2.example": pcrf2},
		Body: `
					group pcrf {
						peers pcrf1.example pcrf2.example
						egress {
							rate 1 5
						}
					}
					route operator.example pcrf 16777238
					watchdog 6s
					reconnect 200ms 1s
					max_bindings 1000
					doic
					binding_store redis main
`}
	caddy := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	auto_https off
	edgesteer_redis main {
		address %s
	}
%s}
http://%s {
	edgesteer_dashboard {
		sample_interval 500ms
	}
}
`, redisAddr, dra.Layer4(), dash))
	caddy.WaitTCP(t, agent)
	caddy.WaitTCP(t, dash)
	agentView := func() diameteragent.View {
		var vs []struct {
			Name string `json:"name"`
			diameteragent.View
		}
		caddy.AdminJSON(t, "/diameter_agent/", &vs)
		if len(vs) != 1 || vs[0].Name != "dra" {
			t.Fatalf("admin view: %+v", vs)
		}
		return vs[0].View
	}
	for deadline := time.Now().Add(20 * time.Second); agentView().Peers[0].State != "OKAY"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pcrf1 not OKAY: %+v", agentView())
		}
	}
	// pcrf1 reports overload (a 20 % HOST report) and its load with every
	// answer (testpeer appends the AVPs posted to /_avps).
	avps := append(doic.EncodeOLR(doic.HostReport, 1, 20, 10*time.Minute, ""), doic.EncodeLoad(doic.LoadHost, 12345, "pcrf1.example")...)
	resp, err := http.Post("http://"+stats+"/_avps?hex="+hex.EncodeToString(avps), "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /_avps: %v %v", resp, err)
	}
	resp.Body.Close()
	// Two pGWs, one named with markup; 12 sessions at once against a burst
	// of 5: the rest refused.
	const xssPeer = "<img src=x onerror=alert(1)>.example"
	pgw1, pgw2 := dialDiameter(t, agent, "pgw1.example"), dialDiameter(t, agent, xssPeer)
	results := map[uint32]int{}
	for i := range 6 {
		results[pgw1.ccrI(fmt.Sprint("pgw1.example;", i))]++
		results[pgw2.ccrI(fmt.Sprint("pgw2.example;", i))]++
	}
	if results[diam.Success] == 0 || results[diam.UnableToDeliver] == 0 {
		t.Fatalf("answers by Result-Code %v: want some 2001 and some 3002", results)
	}

	b := newBrowser(t, 1280, 800)
	b.navigate("http://" + dash + "/")
	b.moreRenders(2)
	read := func() (p agentPanel) {
		b.eval(`(function(){var c=document.querySelector('#panel-diameter_agent .card');if(!c||c.closest('[hidden]'))return {};
			return {Tables: Array.from(c.querySelectorAll('table')).map(t => Array.from(t.rows).map(r => Array.from(r.cells).map(d => d.innerText.trim()))),
				Text: c.innerText, Imgs: c.querySelectorAll('img').length,
				Down: Array.from(c.querySelectorAll('.binding-store .down')).map(e => e.innerText).join('|'),
				Points: Object.fromEntries(Array.from(c.querySelectorAll('[data-chart]')).map(x => [x.dataset.chart.split('\u001f').pop(), Number(x.dataset.points)]))}})()`, &p)
		return p
	}
	v := agentView()
	g := v.Groups[0]
	if g.Admitted == 0 || g.Refused == 0 || v.Bindings == 0 {
		t.Fatalf("admin view after the sessions: %+v", v)
	}
	// pcrf2 has never connected: whatever its state is named, not OKAY.
	if v.Peers[0].State != "OKAY" || v.Peers[1].State == "OKAY" {
		t.Fatalf("peers in the admin view: %+v", v.Peers)
	}
	want := map[string][]string{}
	for _, pv := range v.Peers {
		want[pv.Host] = []string{pv.Host, pv.Realm, pv.Address, pv.State}
	}
	if want["pcrf1.example"][2] != pcrf1 || want["pcrf2.example"][2] != pcrf2 {
		t.Fatalf("peers in the admin view: %+v", v.Peers)
	}
	var p agentPanel
	ok := func() bool {
		p = read()
		if len(p.Tables) < 4 || !strings.Contains(p.Text, fmt.Sprintf("bindings %d / 1000", v.Bindings)) {
			return false
		}
		peers := map[string][]string{}
		for _, r := range p.Tables[0][1:] {
			peers[r[0]] = r
		}
		for h, w := range want {
			if r := peers[h]; len(r) != 8 || strings.Join(r[:4], "|") != strings.Join(w, "|") {
				return false
			}
		}
		groupRow := strings.Join(p.Tables[2][1][:4], "|") + "|" + strings.Join(p.Tables[2][1][5:], "|")
		return peers["pcrf1.example"][6] != "—" && strings.Contains(peers["pcrf2.example"][7], "refused") &&
			strings.Join(p.Tables[1][1], "|") == "operator.example|16777238|pcrf" &&
			groupRow == fmt.Sprintf("pcrf|round_robin|%d|%d|%d|%d|%d|%d|%d", g.Pending, g.Admitted, g.Refused, g.Busy, g.Unavailable, g.FailedOver, g.TimedOut) &&
			p.Points["lat"] >= 2 && p.Points["flow"] >= 2 && doicShown(p.Tables, p.Text) &&
			strings.Contains(p.Text, bindingStoreLine(agentView().BindingStore)) && p.Down == ""
	}
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent panel shows %+v; the admin view %+v", p, v)
		}
	}
	bindingStoreDown(t, redis, pgw1, read, agentView)
	var downs []string
	for _, r := range p.Tables[3][1:] {
		downs = append(downs, r[0])
	}
	if strings.Join(downs, "|") != xssPeer+"|pgw1.example" || p.Imgs != 0 {
		t.Errorf("downstream peers %q (want the markup name as text, and pgw1), %d img elements", downs, p.Imgs)
	}
	// At 1280 px nothing in the card is wider than its box.
	var overflow []string
	b.eval(`Array.from(document.querySelectorAll('#panel-diameter_agent .card, #panel-diameter_agent .tablewrap, #panel-diameter_agent table'))
		.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className + " " + e.scrollWidth + ">" + e.clientWidth)`, &overflow)
	if len(overflow) > 0 {
		t.Errorf("wider than their box at 1280 px: %q", overflow)
	}
	b.screenshot("diameter-agent.png")
	requests, dialogs, console := b.recorded()
	for _, r := range requests {
		if !strings.HasPrefix(r, "http://"+dash+"/") {
			t.Errorf("the page requested %s", r)
		}
	}
	if len(dialogs)+len(console) > 0 {
		t.Errorf("dialogs %q, console %q", dialogs, console)
	}
}

// agentPanel is the agent card's tables, row by row, and its text.
type agentPanel struct {
	Tables [][][]string
	Text   string
	Imgs   int
	Points map[string]int
	Down   string // the binding store's DOWN flag, if any
}

// doicShown reports whether the panel shows pcrf1's report in force and
// its load, and the DOIC counts.
func doicShown(tables [][][]string, text string) bool {
	var report, load bool
	for _, tb := range tables {
		if len(tb) < 2 {
			continue
		}
		switch tb[0][0] {
		case "DOIC report in force":
			report = strings.Join(tb[1][:3], "|") == "host|pcrf1.example|20"
		case "peer":
			load = strings.Join(tb[1], "|") == "pcrf1.example|12345"
		}
	}
	return report && load && strings.Contains(text, "DOIC: reports received")
}

// bindingStoreLine is what the panel's binding store lines say of bs:
// its store, prefix, health, queue and the written count.
func bindingStoreLine(bs *diambind.View) string {
	if bs == nil {
		return "(no binding_store in the admin view)"
	}
	state := "healthy"
	if !bs.Healthy {
		state = "DOWN since " + bs.DownSince.Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("binding store %s (prefix %s): %s · queued %d / %d", bs.Store, bs.Prefix, state, bs.Queued, bs.Backlog)
}

// bindingStoreDown stops Redis, opens a session (its write fails until
// the store is marked down) and waits for the panel to flag the store DOWN
// with the admin view's down_since, queue and counts.
func bindingStoreDown(t *testing.T, redis *e2e.Proc, pgw *diameterPeer, read func() agentPanel, agentView func() diameteragent.View) {
	t.Helper()
	start := time.Now()
	redis.Stop()
	// One session bound (pcrf1's 20 % DOIC report or the egress limit may
	// refuse one).
	for i := 0; pgw.ccrI(fmt.Sprint("pgw1.example;outage", i)) != diam.Success; i++ {
		if i == 10 {
			t.Fatal("no session admitted with Redis stopped")
		}
		time.Sleep(200 * time.Millisecond)
	}
	var shown agentPanel
	var bs *diambind.View
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		bs, shown = agentView().BindingStore, read()
		if bs != nil && !bs.Healthy && bs.Queued > 0 && shown.Down == "DOWN since "+bs.DownSince.Format(time.RFC3339Nano) &&
			strings.Contains(shown.Text, bindingStoreLine(bs)) && strings.Contains(shown.Text, fmt.Sprintf("errors %d", bs.Counts.Errors)) &&
			strings.Contains(shown.Text, fmt.Sprintf("downs %d", bs.Counts.Downs)) {
			t.Logf("Redis stopped: the panel flags the store DOWN %v later", time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("with Redis stopped the agent panel shows %+v; the admin view's binding_store %+v", shown, bs)
		}
	}
}
