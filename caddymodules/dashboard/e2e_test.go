package dashboard_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

// xssTenant is a tenant name that is markup: the page must show it as text.
const xssTenant = "<img src=x onerror=alert(1)>"

// ogsJSON is what a CoreDNS ogs plugin's JSON view answers.
const ogsJSON = `{"servers":[{"zone":"gw.example.org.","store":"memory","gateways":[{"name":"gw1.example.org.","address":"10.0.0.1"},{"name":"gw2.example.org.","address":"10.0.0.2"}],
"locations":[{"location":"192.0.2.0/24","order":["gw2.example.org.","gw1.example.org."],"rtts_ms":{"gw1.example.org.":31.2,"gw2.example.org.":12.0},"probed_at":"2026-12-01T07:00:00Z","age_seconds":12.5}],
"redis_healthy":false,"redis_troubles":[{"keys":"location","key_pattern":"edgesteer:ogs:gw.example.org.:{…}","operation":"get","reason":"noperm","error":"NOPERM this user has no permissions to access one of the keys","since":"2026-12-01T07:00:01Z"}],
"last_run":"2026-12-01T07:00:00Z","runs_total":3}]}`

// fakeLDAPNode accepts connections and answers every BindRequest with
// success, holding the connection open: a directory node for tenant_route.
func fakeLDAPNode(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e2e.Accept(t, ln, func(c net.Conn, _ func(net.Conn)) {
		go func() {
			defer c.Close()
			for {
				m, err := ldapwire.Read(c, ldapwire.DefaultMaxLength)
				if err != nil {
					return
				}
				if m.Op == "bind" && m.ID < 128 {
					// BindResponse, resultCode success.
					c.Write([]byte{0x30, 0x0c, 0x02, 0x01, byte(m.ID), 0x61, 0x07, 0x0a, 0x01, 0x00, 0x04, 0x00, 0x04, 0x00})
				}
			}
		}()
	})
	return ln.Addr().String()
}

// bindAs opens an LDAP connection through the router and binds as dn; the
// connection stays open until the test ends.
func bindAs(t *testing.T, addr, dn string) {
	t.Helper()
	c, err := ldap.DialURL("ldap://"+addr, ldap.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetTimeout(30 * time.Second)
	if err := c.Bind(dn, "pw"); err != nil {
		t.Fatalf("bind %s: %v", dn, err)
	}
}

// TestDashboardInChromium runs bin/caddy with latency_bucket,
// peer_rate_limit, tenant_route and the dashboard (with one ogs URL served
// by a fake ogs server and one that is down), and loads the page in
// headless Chromium: every panel names the config's publishers, limits,
// tenants and gateways; a chart gets data points; the markup tenant shows
// as text and no script runs; the page requests nothing outside its Caddy.
// Hostile remotes: replica and ogs URLs that redirect (301, 302, 307, 308)
// to a listener that must get no connection, a replica answering 50 MB,
// and a replica whose tenant, user and peer values carry bidi controls and
// zero-width characters (its cards must read like a clean twin's). Layout:
// no card's content is wider than the card at 1280 px. An ogs URL that
// goes down keeps its card's order and chart, marked stale.
func TestDashboardInChromium(t *testing.T) {
	e2e.SkipShort(t)
	var ogsDown atomic.Bool
	ogs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ogsDown.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, ogsJSON)
	}))
	t.Cleanup(ogs.Close)
	downOGS := "http://" + e2e.Addr(t) + "/ogs"
	// The redirect target: it must never be connected to.
	target, targetConns := e2e.HangingListener(t, "127.0.0.1:0")
	redirectTo := "http://" + target + "/config/"
	codes := []int{301, 302, 307, 308}
	var redirects, redirectOGS []string
	for _, code := range codes {
		u := redirector(t, code, redirectTo)
		redirects, redirectOGS = append(redirects, u), append(redirectOGS, u+"/ogs")
	}
	huge, hugeWritten := hugeReplica(t, 50<<20)
	clean, evil := viewsReplica(t, fakeViews(plain)), viewsReplica(t, fakeViews(hostile))
	replicas := append(append([]string(nil), redirects...), huge, clean, evil) // clean is replica 5, evil 6
	node1, node2 := fakeLDAPNode(t), fakeLDAPNode(t)
	dash, front, pub1, pub2, limited, ldapAddr := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t), e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)

	config := fmt.Sprintf(`{
	auto_https off
	layer4 {
		%[6]s {
			@bind ldap {
				operation bind
				anonymous false
			}
			route @bind {
				tenant_route {
					name directory
					nodes %[7]s %[8]s
					partitions 1
					auto_partitions {
						target_per_node 1
						max 2
					}
				}
			}
		}
	}
}
http://%[1]s {
	encode gzip
	edgesteer_dashboard {
		ogs %[9]s %[10]s %[11]s
		replicas %[12]s
		sample_interval 500ms
		history 5m
	}
}
http://%[2]s {
	reverse_proxy %[3]s %[4]s {
		lb_policy latency_bucket {
			name front-policy
			latency both
			probe http /
			probe_interval 500ms
			segment %[4]s 40ms
			sticky_user {http.request.header.X-User}
			within p2c
			slow_start 30s
			orca_blackout 0s
			orca_expiration 10m
		}
		transport latency_bucket
	}
}
http://%[3]s {
	header endpoint-load-metrics {http.request.header.X-Load}
	respond "one"
}
http://%[4]s {
	header endpoint-load-metrics {http.request.header.X-Load}
	respond "two"
}
http://%[5]s {
	peer_rate_limit {
		name edge-limiter
		profile gold-peers {
			peer {http.request.header.X-Peer}
			rate 5 3
			action reject 429 "limited"
		}
	}
	respond "ok"
}
`, dash, front, pub1, pub2, limited, ldapAddr, node1, node2, ogs.URL+"/ogs", downOGS,
		strings.Join(redirectOGS, " "), strings.Join(replicas, " "))
	caddy := e2e.StartCaddy(t, "caddyfile", config)
	for _, a := range []string{dash, front, limited, ldapAddr} {
		caddy.WaitTCP(t, a)
	}

	// Traffic for each panel.
	for i := range 20 {
		req, _ := http.NewRequest("GET", "http://"+front+"/", nil)
		req.Header.Set("X-User", fmt.Sprint("user-", i))
		// The publishers send back this ORCA report; one answer's is
		// garbage (bad_number), which changes nothing.
		req.Header.Set("X-Load", "TEXT cpu_utilization=0.4")
		if i == 10 {
			req.Header.Set("X-Load", "TEXT cpu_utilization=zz")
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	rejected := 0
	for range 10 {
		req, _ := http.NewRequest("GET", "http://"+limited+"/", nil)
		req.Header.Set("X-Peer", "pgw1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			rejected++
		}
	}
	if rejected == 0 {
		t.Fatal("the limiter rejected nothing")
	}
	bindAs(t, ldapAddr, "uid=alice,o=acme,dc=example")
	bindAs(t, ldapAddr, "uid=bob,o=acme,dc=example")
	bindAs(t, ldapAddr, `uid=eve,o=\3cimg src\3dx onerror\3dalert(1)\3e,dc=example`)
	bindAs(t, ldapAddr, "uid=mallory,o="+hostile("evil")+",dc=example")

	// Chromium, headless, recording requests, dialogs, console and
	// exceptions; 1280 × 800 px.
	b := newBrowser(t, 1280, 800)
	eval, moreRenders := b.eval, b.moreRenders

	base := "http://" + dash + "/"
	b.navigate(base)
	b.viewport(1280, 800)
	// A few refreshes (every 2 s): the latency chart has points after the
	// first, and more after later ones (each brings only the new samples).
	deadline := time.Now().Add(90 * time.Second)
	var renders, points, firstRenders, firstPoints int
	for {
		eval(`Number(document.body.dataset.renders || 0)`, &renders)
		eval(`(function(){var b=document.querySelector('[data-chart$="\u001flat"]');return b?Number(b.dataset.points):0})()`, &points)
		if firstRenders == 0 && renders > 0 {
			firstRenders, firstPoints = renders, points
		}
		if firstRenders > 0 && renders >= firstRenders+3 && points > firstPoints+2 {
			break
		}
		if time.Now().After(deadline) {
			_, _, console := b.recorded()
			t.Fatalf("after 90 s: %d renders, %d points in the latency chart (%d after render %d); console %q", renders, points, firstPoints, firstRenders, console)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d renders, %d points in the latency chart (%d after render %d)", renders, points, firstPoints, firstRenders)
	// After more refreshes than one window holds, the chart holds the whole
	// history the server has (less the samples taken since the last poll).
	moreRenders(6)
	eval(`(function(){var b=document.querySelector('[data-chart$="\u001flat"]');return b?Number(b.dataset.points):0})()`, &points)
	resp, err := http.Get(base + "api/state")
	if err != nil {
		t.Fatal(err)
	}
	var full struct {
		Series struct{ Values map[string][]*float64 }
	}
	err = json.NewDecoder(resp.Body).Decode(&full)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for k, v := range full.Series.Values {
		if strings.HasPrefix(k, "latency_bucket\x1ffront-policy\x1f") && strings.HasSuffix(k, "latency_ms") {
			for _, x := range v {
				if x != nil {
					held++
				}
			}
		}
	}
	// A page that kept only the last poll's window (about 6 s of the 15 s
	// or more held) would fall below three quarters.
	if points > held || points < held*3/4 {
		t.Errorf("the latency chart has %d points, the server %d", points, held)
	}
	t.Logf("after 6 more refreshes: %d points in the chart, %d on the server", points, held)

	var text, xssText string
	var hidden []string
	var imgs, xssSpans int
	eval(`document.body.innerText`, &text)
	eval(`Array.from(document.querySelectorAll('section.panel')).filter(s => s.hidden).map(s => s.id)`, &hidden)
	eval(`document.querySelectorAll('main img').length`, &imgs)
	eval(`Array.from(document.querySelectorAll('.tenant')).filter(s => s.textContent === `+"`"+xssTenant+"`"+`).length`, &xssSpans)
	eval(`Array.from(document.querySelectorAll('.tenant')).map(s => s.textContent).join("|")`, &xssText)
	// latency both: each publisher's row has its probe figure, the observed
	// average / peak of the proxied requests, and which one decided.
	var lbRows [][]string
	eval(`Array.from(document.querySelectorAll('.card')).filter(c => c.dataset.id.startsWith("lb")).flatMap(c =>
		Array.from(c.querySelector('.tablewrap').querySelectorAll('tbody tr')).map(r => Array.from(r.cells).map(d => d.innerText)))`, &lbRows)
	observed := 0
	for _, r := range lbRows {
		if len(r) != 10 || (r[4] != "probe" && r[4] != "traffic") {
			t.Errorf("publisher row %q: want 10 cells, decided by probe or traffic", r)
			continue
		}
		if r[3] != "—" && strings.Contains(r[3], " / ") {
			observed++
		}
	}
	if observed == 0 {
		t.Errorf("no publisher row shows an observed average / peak: %q", lbRows)
	}
	checkPublisherLoad(t, b, caddy, pub1, pub2)
	for _, want := range []string{
		"Publisher selection", "front-policy", pub1, pub2, "[32,64)", "observed ms avg / peak", "decided by",
		"Rate limiting", "edge-limiter", "gold-peers", "5.0 / 3",
		"Tenant routing", "directory", node1, node2, "acme", xssTenant, "1 → 2", // acme's growth, in the placement changes
		"Gateway selection", "gw1.example.org.", "gw2.example.org.", "192.0.2.0/24", "1. gw2.example.org. (12.0)", "unreachable",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	// Panels for modules not configured stay hidden; the others show.
	for _, h := range hidden {
		if h != "panel-ntier" && h != "panel-replicas" && h != "panel-other" && h != "panel-diameter_agent" {
			t.Errorf("panel %s hidden", h)
		}
	}
	if imgs != 0 || xssSpans != 1 {
		t.Errorf("the markup tenant: %d img elements, %d tenant cells with its text (tenants %q)", imgs, xssSpans, xssText)
	}

	checkHostileRemotes(t, b, text, redirectTo, codes, targetConns)
	// The dashboard stops reading the 50 MB answer after 4 MiB and hangs
	// up: the replica's write fails, having got out at most those 4 MiB
	// and what the two sockets' buffers held.
	for deadline := time.Now().Add(10 * time.Second); hugeWritten.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if n, most := hugeWritten.Load(), 4<<20+socketBuffers(); n == 0 || n > most {
		t.Errorf("the 50 MB replica got %d bytes out before its write failed (0: it never failed), want 1 to %d: "+
			"4 MiB read and this host's socket buffers", n, most)
	}

	// At 1280 px no card's content is wider than the card.
	var overflowing []string
	eval(overflowJS, &overflowing)
	for _, o := range overflowing {
		t.Errorf("at 1280 px: %s", o)
	}
	b.screenshot("dashboard-1280.png")

	// A phone: nothing wider than the screen, after a refresh at that width
	// (tables may scroll inside their card).
	b.viewport(390, 844)
	moreRenders(2)
	var overflow bool
	eval(`document.documentElement.scrollWidth > window.innerWidth + 1`, &overflow)
	b.screenshot("dashboard-390.png")
	if overflow {
		t.Error("the page is wider than a 390 px screen")
	}
	b.viewport(1280, 800)

	// The ogs URL goes down: its card keeps the last order and chart,
	// marked stale with the answer's age.
	ogsDown.Store(true)
	var ogsCard struct {
		Text   string
		Stale  bool
		Charts int
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		moreRenders(1)
		eval(`(function(){var c=Array.from(document.querySelectorAll('.card')).find(c=>c.dataset.id==="ogs\u001f0");
			return {text:c.innerText, stale:c.classList.contains('stale'), charts:c.querySelectorAll('[data-chart] canvas').length}})()`, &ogsCard)
		if ogsCard.Stale || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{"unreachable: HTTP 503", "stale: the last answer,", " s old", "1. gw2.example.org. (12.0)", "192.0.2.0/24",
		"redis unhealthy", "edgesteer:ogs:gw.example.org.:{…}", "noperm", "NOPERM this user has no permissions"} {
		if !ogsCard.Stale || !strings.Contains(ogsCard.Text, want) {
			t.Errorf("the ogs card after its URL went down (stale %v) does not show %q: %q", ogsCard.Stale, want, ogsCard.Text)
		}
	}
	if ogsCard.Charts == 0 {
		t.Error("the ogs card lost its chart when its URL went down")
	}

	// caddy reload with the dashboard's settings unchanged (another site
	// changed): the sampler and its history carry over, the page goes on.
	samples := func() int {
		t.Helper()
		resp, err := http.Get(base + "api/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Series struct {
				TimesMS []int64 `json:"times_ms"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return len(st.Series.TimesMS)
	}
	before := samples()
	caddy.Reload(t, "caddyfile", strings.Replace(config, `respond "one"`, `respond "uno"`, 1))
	if after := samples(); after < before {
		t.Errorf("history after the reload: %d samples, %d before", after, before)
	}
	moreRenders(2)

	requests, dialogs, console := b.recorded()
	if len(dialogs) != 0 {
		t.Errorf("dialogs opened: %q", dialogs)
	}
	for _, c := range console {
		if strings.Contains(c, "alert") || strings.HasPrefix(c, "exception") || strings.HasPrefix(c, "error") {
			t.Errorf("console: %s", c)
		}
	}
	if len(requests) < 5 || !slices.ContainsFunc(requests, func(u string) bool { return strings.HasPrefix(u, base+"api/state?window=") }) {
		t.Errorf("%d requests recorded, want the page, its assets, api/state and later api/state?window=…: %q", len(requests), requests)
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, base) && !strings.HasPrefix(u, "data:") {
			t.Errorf("the page requested %s, outside %s", u, base)
		}
	}
}
