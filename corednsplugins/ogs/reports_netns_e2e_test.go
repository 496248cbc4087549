package ogs_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The namespace topology of TestReportsPerNetworkInNamespaces: CoreDNS and
// the resolver share one /28, each client network has its own.
const (
	nsDNSNet = "10.77.0.0/28"  // dns .2, resolver .3
	nsNetA   = "10.77.0.16/28" // reporters and clients .17 to .21
	nsNetB   = "10.77.0.32/28" // .33 to .46
)

// nsDelays is the one-way delay (ms) each gateway adds to what it sends to
// each network, so to every round trip from there: three orders, none the
// configured one (gw1 gw2 gw3), which a location's first answer may show.
var nsDelays = map[string][3]int{
	//             gw1  gw2  gw3     order
	nsDNSNet: {20, 140, 80}, // gw1 gw3 gw2
	nsNetA:   {140, 80, 20}, // gw3 gw2 gw1
	nsNetB:   {80, 20, 140}, // gw2 gw1 gw3
}

// nsGateways starts gw1..gw3, plain HTTP servers on port 8080 that answer
// at once, each behind real packet delay (e2e.Topology.Delay) towards each
// network of nsDelays.
func nsGateways(t *testing.T, tp *e2e.Topology) {
	t.Helper()
	for i := range 3 {
		host := fmt.Sprintf("gw%d", i+1)
		var l net.Listener
		if err := tp.In(host, func() (err error) { l, err = net.Listen("tcp", tp.IP(host)+":8080"); return }); err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		delays := map[string]time.Duration{}
		for network, d := range nsDelays {
			delays[network] = time.Duration(d[i]) * time.Millisecond
		}
		tp.Delay(t, host, delays)
	}
}

// srvOrder is the gateways of an SRV answer by priority, the order that
// survives a resolver's rotation of records.
func srvOrder(m *dns.Msg) string {
	var srvs []*dns.SRV
	for _, rr := range m.Answer {
		if s, ok := rr.(*dns.SRV); ok {
			srvs = append(srvs, s)
		}
	}
	slices.SortFunc(srvs, func(a, b *dns.SRV) int { return int(a.Priority) - int(b.Priority) })
	var names []string
	for _, s := range srvs {
		names = append(names, strings.TrimSuffix(s.Target, ".example.test."))
	}
	return strings.Join(names, " ")
}

// Where the clients are: two client networks and three gateways in network
// namespaces, with real packet delay between each network and each
// gateway (nsDelays, so every network has another optimal gateway), and
// CoreDNS, two replicas sharing one redis-server, at distances of its own.
// Clients ask Debian's unbound (one per replica), which asks CoreDNS with
// EDNS Client Subnet /28: the location CoreDNS orders for is the one
// unbound's ECS names, never unbound's own address. Orders are read from
// SRV priorities (unbound rotates A records).
//
//   - Without reports both networks get CoreDNS's own order, gw1 gw3 gw2,
//     on both replicas.
//   - Three reporters in each network (bin/ogs-report, probing the gateways
//     through the delays, all six at once) report to replica 1 only; then
//     each network gets its own order (A gw3 gw2 gw1, B gw2 gw1 gw3) with
//     "source reports" in the TXT, from both replicas.
//   - Adversaries, with none of them changing any order: a fourth reporter
//     in A claiming gw1 (A's farthest) at 1 ms is outvoted; a report from
//     A whose body names network B is refused (400 malformed), one whose
//     X-Forwarded-For names B (no trusted_proxies) counts for A; an
//     unknown token (401 unauthorized, through the reporter: exit 3), a
//     body above report_max_body (413 too_large), and a flood of 14
//     reports at once with one token from 14 addresses (report_rate 5 5:
//     429 rate_limited_token beyond the burst) are refused, each counted
//     by reason in coredns_ogs_reports_total.
//   - Replica 2's reload (the reload plugin) keeps the aggregates.
func TestReportsPerNetworkInNamespaces(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"dns": 2, "resolver": 3, "netA": 17, "netB": 33, "gw1": 51, "gw2": 52, "gw3": 53})
	for host, last := range map[string][2]int{"netA": {18, 21}, "netB": {34, 46}} {
		for i := last[0]; i <= last[1]; i++ {
			tp.Run(t, host, "ip", "addr", "add", fmt.Sprintf("10.77.0.%d/24", i), "dev", "eth0")
		}
	}
	nsGateways(t, tp)
	dir := t.TempDir()
	tok := adversaryTokens
	tokens := filepath.Join(dir, "tokens")
	writeTokens(t, tokens, tok)
	// tokenFile writes the token's file, replacing it in one step: reporters
	// started at once with one token write it at once, and a plain write
	// (truncate, then write) let one read it empty ("no token").
	tokenFile := func(token string) string {
		path := filepath.Join(dir, "token-"+token)
		tmp, err := os.CreateTemp(dir, "token-*")
		if err == nil {
			_, err = tmp.WriteString(token + "\n")
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			t.Error(err)
		}
		return path
	}

	tp.Start(t, "dns", "redis", "redis-server", nil, e2e.RedisArgs(dir, "127.0.0.1:6379")...)
	corefile := func(admin, metrics string, ttl int) string {
		return fmt.Sprintf(`vpn.example.test {
	bind %s
	reload 2s 0s
	ogs {
		gateway gw1.example.test %s:8080
		gateway gw2.example.test %s:8080
		gateway gw3.example.test %s:8080
		probe http /
		srv
		prefix 28 56
		ttl %d
		admin %s
		report_tokens %s
		report_rate 5 5
		report_max_body 1024
		store redis {
			address 127.0.0.1:6379
		}
	}
	prometheus %s
}
`, tp.IP("dns"), tp.IP("gw1"), tp.IP("gw2"), tp.IP("gw3"), ttl, admin, tokens, metrics)
	}
	type replica struct {
		p                      *e2e.Proc
		admin, metrics, config string
		resolver               string // the unbound in front of it
	}
	var reps []*replica
	for i, port := range []string{"53", "5353"} {
		r := &replica{
			admin:    fmt.Sprintf("%s:%d", tp.IP("dns"), 8053+i),
			metrics:  fmt.Sprintf("%s:%d", tp.IP("dns"), 9153+i),
			config:   filepath.Join(dir, fmt.Sprintf("Corefile%d", i)),
			resolver: net.JoinHostPort(tp.IP("resolver"), port),
		}
		os.WriteFile(r.config, []byte(corefile(r.admin, r.metrics, 5)), 0o644)
		r.p = tp.Start(t, "dns", fmt.Sprintf("coredns%d", i+1), e2e.Bin(t, "coredns"), nil, "-conf", r.config, "-dns.port", port)
		tp.StartUnbound(t, "resolver", e2e.Unbound{
			Listen: r.resolver, Allow: "10.77.0.0/24", ECSPrefix: 28,
			Upstream: net.JoinHostPort(tp.IP("dns"), port), Zones: []string{"vpn.example.test"},
		})
		reps = append(reps, r)
	}
	// A client of each network asks its resolver, as a stub does.
	clients := map[string]string{"netA": "10.77.0.17", "netB": "10.77.0.33"}
	ask := func(r *replica, host, name string, qtype uint16) (*dns.Msg, error) {
		var m *dns.Msg
		err := tp.In(host, func() (err error) { m, err = resolve(r.resolver, clients[host], name, qtype); return })
		return m, err
	}
	order := func(r *replica, host string) string {
		m, err := ask(r, host, "vpn.example.test", dns.TypeSRV)
		if err != nil {
			return err.Error()
		}
		return srvOrder(m)
	}
	const own, orderA, orderB = "gw1 gw3 gw2", "gw3 gw2 gw1", "gw2 gw1 gw3"
	start := time.Now()
	// converge waits until every replica answers each network its wanted
	// order, checks the TXT says whether reports decided it, and with
	// hold keeps asking for longer than the answers' TTL (5 s): an answer
	// unbound had cached before a change has then expired, so what is
	// seen is what CoreDNS answers after it.
	converge := func(stage string, want map[string]string, fromReports, hold bool) {
		t.Helper()
		defer func() { t.Logf("%s: at %.1f s", stage, time.Since(start).Seconds()) }()
		for i, r := range reps {
			r.p.WaitFor(t, stage, 60*time.Second, func() error {
				for host, w := range want {
					if got := order(r, host); got != w {
						return fmt.Errorf("replica %d, %s: %q, want %q", i+1, host, got, w)
					}
				}
				return nil
			})
			for host := range want {
				m, err := ask(r, host, "_ogs.vpn.example.test", dns.TypeTXT)
				if txt := fmt.Sprint(m); err != nil || strings.Contains(txt, "(source reports)") != fromReports {
					t.Fatalf("%s, replica %d, %s's TXT (from reports: %v): %v\n%s", stage, i+1, host, fromReports, err, txt)
				}
			}
		}
		for until := time.Now().Add(6 * time.Second); hold && time.Now().Before(until); time.Sleep(250 * time.Millisecond) {
			for i, r := range reps {
				for host, w := range want {
					if got := order(r, host); got != w {
						t.Fatalf("%s, replica %d, %s: %q once unbound's cached answer expired, want %q", stage, i+1, host, got, w)
					}
				}
			}
		}
	}
	converge("without reports: CoreDNS's own order", map[string]string{"netA": own, "netB": own}, false, false)

	report := func(host, src, token string) (int, string) {
		args := []string{"-url", "http://" + reps[0].admin + "/ogs/reports", "-token-file", tokenFile(token), "-probe", "http", "-source", src}
		for i := 1; i <= 3; i++ {
			args = append(args, "-gateway", fmt.Sprintf("gw%d.example.test=%s:8080", i, tp.IP(fmt.Sprintf("gw%d", i))))
		}
		out, err := tp.Command(host, e2e.Bin(t, "ogs-report"), args...).CombinedOutput()
		code := 0
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Error(err)
		}
		return code, string(out)
	}
	var wg sync.WaitGroup
	for host, srcs := range map[string][]string{"netA": {"10.77.0.17", "10.77.0.18", "10.77.0.19"}, "netB": {"10.77.0.33", "10.77.0.34", "10.77.0.35"}} {
		token := map[string]string{"netA": tok["honest-a"], "netB": tok["honest-b"]}[host]
		for _, src := range srcs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, out := report(host, src, token); code != 0 {
					t.Errorf("reporter %s: exit %d\n%s", src, code, out)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	reported := map[string]string{"netA": orderA, "netB": orderB}
	converge("after the reports (to replica 1 only)", reported, true, false)
	logMeasured(t, tp, reps[0].admin)

	nsAdversaries(t, tp, reps[0].admin, reps[0].metrics, tok)
	if code, out := report("netB", "10.77.0.36", "not-a-known-token-at-all"); code != 3 || !strings.Contains(out, "401 unauthorized") {
		t.Fatalf("an unknown token: exit %d\n%s", code, out)
	}
	converge("after the adversaries", reported, true, true)
	for reason, want := range map[string]float64{"accepted": 8, "unauthorized": 1, "too_large": 1} {
		series := `coredns_ogs_reports_total{result="` + reason + `"}`
		if n, _ := tp.MetricAt(t, "dns", "http://"+reps[0].metrics+"/metrics", series); n != want {
			t.Errorf("replica 1: %s %v, want %v", series, n, want)
		}
	}

	// Replica 2 reloads (another TTL): the aggregates answer on.
	os.WriteFile(reps[1].config, []byte(corefile(reps[1].admin, reps[1].metrics, 4)), 0o644)
	reps[1].p.WaitLog(t, "Reloading complete", 30*time.Second)
	converge("after replica 2's reload", reported, true, true)
}

// nsAdversaries sends TestReportsPerNetworkInNamespaces' refused and
// outvoted reports to the admin listener at admin and checks each answer
// and, for the flood, the counts of its reasons at metrics.
func nsAdversaries(t *testing.T, tp *e2e.Topology, admin, metrics string, tok map[string]string) {
	t.Helper()
	from := func(host, src string) *http.Client {
		return reportClient(tp.Dialer(host, &net.TCPAddr{IP: net.ParseIP(src)}))
	}
	// A liar in A: gw1, A's farthest, at 1 ms.
	if code, body := sendReport(t, from("netA", "10.77.0.20"), admin, tok["liar"], reportBody([3]float64{1, 900, 900}, "")); code != http.StatusAccepted {
		t.Fatalf("the liar's report: %d %s", code, body)
	}
	// Claims of network B from A: a body naming it has no such field; a
	// forwarded-for header naming it comes from no trusted proxy, so the
	// report (B's farthest, gw3, at 1 ms) is A's, where gw3 is the best.
	wreckB := [3]float64{900, 900, 1}
	if code, body := sendReport(t, from("netA", "10.77.0.21"), admin, tok["liar"], reportBody(wreckB, `"location":"10.77.0.32/28",`)); code != http.StatusBadRequest || !strings.Contains(body, `"error":"malformed"`) {
		t.Fatalf("a body naming network B: %d %s, want 400 malformed", code, body)
	}
	if code, body := sendReport(t, from("netA", "10.77.0.21"), admin, tok["liar"], reportBody(wreckB, ""), "X-Forwarded-For", "10.77.0.33"); code != http.StatusAccepted || !strings.Contains(body, `"location":"10.77.0.16/28"`) {
		t.Fatalf("a report forwarded for network B: %d %s, want 202 for A's 10.77.0.16/28", code, body)
	}
	if code, body := sendReport(t, from("netA", "10.77.0.21"), admin, tok["liar"], strings.Repeat(" ", 2048)+"{}"); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"error":"too_large"`) {
		t.Fatalf("a body above report_max_body: %d %s, want 413 too_large", code, body)
	}
	// A flood with one token from 14 addresses of B, all at once; the
	// bodies are empty, so what the burst lets through is refused as
	// malformed and casts no vote.
	var mu sync.Mutex
	var wg sync.WaitGroup
	codes := map[int]int{}
	for i := 33; i <= 46; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := sendReport(t, from("netB", fmt.Sprintf("10.77.0.%d", i)), admin, tok["flooder"], "{}")
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[http.StatusTooManyRequests] < 14-5-1 || codes[http.StatusTooManyRequests]+codes[http.StatusBadRequest] != 14 { // the burst of 5, and at most one refill
		t.Fatalf("a flood of 14 with one token: %v, want about 9 refused with 429, the rest 400", codes)
	}
	for reason, want := range map[string]int{"rate_limited_token": codes[http.StatusTooManyRequests], "malformed": codes[http.StatusBadRequest] + 1} {
		series := `coredns_ogs_reports_total{result="` + reason + `"}`
		if n, _ := tp.MetricAt(t, "dns", "http://"+metrics+"/metrics", series); n != float64(want) {
			t.Errorf("%s %v, want %d", series, n, want)
		}
	}
}

// logMeasured logs the RTTs the admin view at admin shows: the plugin's
// own probes per location, and the reporters' medians per network.
func logMeasured(t *testing.T, tp *e2e.Topology, admin string) {
	t.Helper()
	type rtts struct {
		Location string             `json:"location"`
		RTTsMs   map[string]float64 `json:"rtts_ms"`
	}
	var v struct {
		Servers []struct {
			Locations []rtts `json:"locations"`
			Reports   struct {
				Locations []rtts `json:"locations"`
			} `json:"reports"`
		} `json:"servers"`
	}
	resp, err := tp.HTTPClient("dns").Get("http://" + admin + "/ogs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, l := range v.Servers[0].Locations {
		t.Logf("probed by CoreDNS for %s: %v", l.Location, l.RTTsMs)
	}
	for _, l := range v.Servers[0].Reports.Locations {
		t.Logf("reported from %s (medians): %v", l.Location, l.RTTsMs)
	}
}
