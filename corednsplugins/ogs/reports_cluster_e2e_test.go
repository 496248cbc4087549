package ogs_test

import (
	"context"
	"fmt"
	"io"
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
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// postReport sends one report for the three cluster gateways from src
// (a local address) to the admin listener at admin; it returns the status.
func postReport(t *testing.T, admin, src, token string, rtts [3]float64) (int, string) {
	t.Helper()
	return sendReport(t, fromAddr(src), admin, token, reportBody(rtts, ""))
}

// fromAddr is an HTTP client whose connections leave from src.
func fromAddr(src string) *http.Client {
	return reportClient((&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext)
}

// reportBody is a report, made now, of the three cluster gateways' RTTs in
// milliseconds; extra (`"field":value,`) goes first.
func reportBody(rtts [3]float64, extra string) string {
	var gws []string
	for i, ms := range rtts {
		gws = append(gws, fmt.Sprintf(`{"name":"gw%d.example.test","rtt_ms":%g}`, i+1, ms))
	}
	return fmt.Sprintf(`{%s"probe":"http","time":%q,"gateways":[%s]}`, extra, time.Now().UTC().Format(time.RFC3339), strings.Join(gws, ","))
}

// reportClient is an HTTP client whose connections dial makes (from a
// source address, or in a namespace).
func reportClient(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial}}
}

// sendReport posts body with token, and headers (name, value, ...), to the
// admin listener at admin through c; it returns the status and the answer
// (0 and the error, counted as the test's, when none came).
func sendReport(t *testing.T, c *http.Client, admin, token, body string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+admin+"/ogs/reports", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("report to %s: %v", admin, err)
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// adversaryTokens are the report tokens of the adversary tests, id → token.
var adversaryTokens = map[string]string{"honest-a": "honest-a-token-0123456789", "honest-b": "honest-b-token-0123456789", "liar": "liar-token-0123456789abc", "flooder": "flooder-token-0123456789"}

// writeTokens writes a report_tokens file of tok (id → token) at path.
func writeTokens(t *testing.T, path string, tok map[string]string) {
	t.Helper()
	var lines []string
	for id, tk := range tok {
		lines = append(lines, id+" "+tk)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// reportsAdmin is the admin view's reports part.
type reportsAdmin struct {
	Servers []struct {
		RedisTroubles []struct {
			Keys string `json:"keys"`
		} `json:"redis_troubles"`
		Reports struct {
			Shared       bool `json:"shared"`
			StoreBacklog *int `json:"store_backlog"`
			Locations    []struct {
				Location  string   `json:"location"`
				Reporters int      `json:"reporters"`
				Source    string   `json:"source"`
				Order     []string `json:"order"`
			} `json:"locations"`
		} `json:"reports"`
	} `json:"servers"`
}

func fetchReportsAdmin(t *testing.T, addr string) reportsAdmin {
	t.Helper()
	var v reportsAdmin
	getAdmin(t, addr, &v)
	return v
}

// Two replicas with store redis and client reports. CoreDNS's own probes
// order the gateways .12, .13, .11 (100, 200, 300 ms); reporters of
// 127.0.5.0/24 measure gw1 5 ms, gw3 10 ms, gw2 50 ms. Three reports, sent
// at once, reach replica a only: a answers that network .11, .13, .12 at
// once, and b, which never saw a report, answers the same once it pulled
// them from Redis, with "source reports" in its TXT; another network still
// gets CoreDNS's own order on both. With Redis killed, b's SIGUSR1 reload
// keeps the aggregate (b answers from reports, Redis gone), and a fourth
// report to a is accepted (202), answers there, is counted as a store
// error of the reports' keys and shown in the admin view (troubles and
// backlog); once Redis is back (empty), a writes it again and b counts
// the fourth reporter too.
func TestClusterSharesReports(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	redisAddr, redisDir := e2e.Addr(t), t.TempDir()
	rp := e2e.StartRedisAt(t, redisDir, redisAddr)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("office "+e2eToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	extra := "\t\treport_tokens " + tokens + "\n\t\treport_rate 50 50\n"
	a := startReplica(t, gws, redisAddr, extra)
	bMetrics, bAdmin := e2e.Addr(t), e2e.Addr(t)
	b := startReloadable(t, clusterCorefile(gws, redisAddr, bMetrics, bAdmin, extra))
	b.waitFor(t, "b's admin listener", func() bool {
		c, err := net.Dial("tcp", bAdmin)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	own := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	reported := []string{"127.0.0.11", "127.0.0.13", "127.0.0.12"}
	const network = "127.0.5.0/24"
	for _, addr := range []string{a.Addr, b.addr} {
		if ips, _ := query(t, addr, network); !slices.Equal(ips, own) {
			t.Fatalf("%s before reports: %v, want CoreDNS's own order %v", addr, ips, own)
		}
	}

	var wg sync.WaitGroup
	for _, src := range []string{"127.0.5.1", "127.0.5.2", "127.0.5.3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, body := postReport(t, a.admin, src, e2eToken, [3]float64{5, 50, 10}); code != http.StatusAccepted {
				t.Errorf("report from %s: %d %s", src, code, body)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if ips, ttl := query(t, a.Addr, network); !slices.Equal(ips, reported) || ttl != 30 {
		t.Fatalf("a after three reports: %v ttl %d, want %v ttl 30", ips, ttl, reported)
	}
	b.waitFor(t, "b answering the reported order", func() bool {
		ips, _ := aRecords(ask(t, b.addr, "vpn.example.test", dns.TypeA, network))
		return slices.Equal(ips, reported)
	})
	txt := fmt.Sprint(ask(t, b.addr, "_ogs.vpn.example.test", dns.TypeTXT, network).Answer)
	if !strings.Contains(txt, "source reports") || !strings.Contains(txt, "3 reporters") {
		t.Fatalf("b's TXT: %s", txt)
	}
	for _, addr := range []string{a.Addr, b.addr} {
		if ips, _ := query(t, addr, "10.9.0.0/24"); !slices.Equal(ips, own) {
			t.Fatalf("%s, another network: %v, want %v", addr, ips, own)
		}
	}
	// The layout the README documents.
	keys, err := rdb.Keys(ctx, "e2e:ogs:vpn.example.test.:reports{*}:*").Result()
	if err != nil || len(keys) != 3 {
		t.Fatalf("report keys %v (%v), want idx, v: and r: of one location", keys, err)
	}
	for _, k := range keys {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 4*time.Hour {
			t.Fatalf("%s: TTL %v, want report_window (4h)", k, ttl)
		}
		if strings.Contains(k, "}:v:") && rdb.HLen(ctx, k).Val() != 9 {
			t.Fatalf("%s: %d votes, want 3 reporters x 3 gateways", k, rdb.HLen(ctx, k).Val())
		}
	}

	rp.Kill()
	b.reload(t, "", true)
	if ips, ttl := aRecords(ask(t, b.addr, "vpn.example.test", dns.TypeA, network)); !slices.Equal(ips, reported) || ttl != 30 {
		t.Fatalf("b after a reload with Redis down: %v ttl %d, want the reported order %v", ips, ttl, reported)
	}
	if code, body := postReport(t, a.admin, "127.0.5.4", e2eToken, [3]float64{5, 50, 10}); code != http.StatusAccepted {
		t.Fatalf("report with Redis down: %d %s, want 202 (answered from a's reports)", code, body)
	}
	if n := metricWith(t, a.metrics, "coredns_ogs_store_errors_total", `operation="put_reports"`); n < 1 {
		t.Fatalf("a: %v store errors of put_reports counted", n)
	}
	v := fetchReportsAdmin(t, a.admin)
	if s := v.Servers[0]; len(s.RedisTroubles) == 0 || !s.Reports.Shared || s.Reports.StoreBacklog == nil || *s.Reports.StoreBacklog < 1 {
		t.Fatalf("a's admin view with Redis down: %+v", s)
	}
	if l := v.Servers[0].Reports.Locations; len(l) != 1 || l[0].Reporters != 4 || l[0].Source != "reports" {
		t.Fatalf("a's reports with Redis down: %+v", l)
	}

	e2e.StartRedisAt(t, redisDir, redisAddr) // empty: it kept nothing
	b.waitFor(t, "b counting the fourth reporter", func() bool {
		l := fetchReportsAdmin(t, bAdmin).Servers[0].Reports.Locations
		return len(l) == 1 && l[0].Reporters == 4
	})
	if w := fetchReportsAdmin(t, a.admin).Servers[0].Reports.StoreBacklog; w == nil || *w != 0 {
		t.Fatalf("a's backlog after Redis returned: %v", w)
	}
}

// Reporters of two networks on loopback, A (127.0.6.0/24) and B
// (127.0.7.0/24), each with its own token; every group sent at once.
// CoreDNS's own order is .12, .13, .11. A's three honest reporters measure
// gw1 5, gw3 10, gw2 50 ms (.11, .13, .12); B's measure gw2 5, gw1 10, gw3
// 60 ms (.12, .11, .13): each network gets its own order. A fourth
// reporter in A claiming the far gw2 at 1 ms changes nothing (its vote is
// one of four: the median stays 50 ms). A report whose body names network
// B (an unknown field) is refused as malformed and B is unchanged; an
// unknown token gets 401, an oversized body 413, and a flood with one
// token (20 at once from 20 addresses, report_rate 5 5) 429
// rate_limited_token beyond the burst; each refusal is counted by reason.
func TestReportsAdversaries(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, adversaryTokens)
	tok := adversaryTokens
	r := startReplica(t, gws, redisAddr, "\t\treport_tokens "+tokens+"\n\t\treport_rate 5 5\n\t\treport_max_body 1024\n")
	own := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	orderA, orderB := []string{"127.0.0.11", "127.0.0.13", "127.0.0.12"}, []string{"127.0.0.12", "127.0.0.11", "127.0.0.13"}
	const netA, netB = "127.0.6.0/24", "127.0.7.0/24"
	for _, n := range []string{netA, netB} {
		if ips, _ := query(t, r.Addr, n); !slices.Equal(ips, own) {
			t.Fatalf("%s before reports: %v, want CoreDNS's own %v", n, ips, own)
		}
	}
	burst := func(srcs []string, token string, rtts [3]float64) (codes []int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, src := range srcs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, _ := postReport(t, r.admin, src, token, rtts)
				mu.Lock()
				codes = append(codes, code)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return codes
	}
	accepted := func(codes []int) bool {
		for _, c := range codes {
			if c != http.StatusAccepted {
				return false
			}
		}
		return true
	}
	if c := burst([]string{"127.0.6.1", "127.0.6.2", "127.0.6.3"}, tok["honest-a"], [3]float64{5, 50, 10}); !accepted(c) {
		t.Fatalf("A's reports: %v", c)
	}
	if c := burst([]string{"127.0.7.1", "127.0.7.2", "127.0.7.3"}, tok["honest-b"], [3]float64{10, 5, 60}); !accepted(c) {
		t.Fatalf("B's reports: %v", c)
	}
	check := func(stage string) {
		t.Helper()
		for n, want := range map[string][]string{netA: orderA, netB: orderB} {
			if ips, ttl := query(t, r.Addr, n); !slices.Equal(ips, want) || ttl != 30 {
				t.Fatalf("%s, %s: %v ttl %d, want %v ttl 30", stage, n, ips, ttl, want)
			}
			txt := fmt.Sprint(ask(t, r.Addr, "_ogs.vpn.example.test", dns.TypeTXT, n).Answer)
			if !strings.Contains(txt, "source reports") {
				t.Fatalf("%s, %s TXT: %s", stage, n, txt)
			}
		}
		if ips, _ := query(t, r.Addr, "10.9.0.0/24"); !slices.Equal(ips, own) {
			t.Fatalf("%s, a network without reports: %v", stage, ips)
		}
	}
	check("after the honest reports")

	if c := burst([]string{"127.0.6.9"}, tok["liar"], [3]float64{300, 1, 300}); !accepted(c) {
		t.Fatalf("the liar's report: %v", c)
	}
	check("after a liar in A")

	// A body naming B: no such field; the location is where it comes from.
	body := reportBody([3]float64{900, 900, 1}, `"location":"127.0.7.0/24",`)
	post := func(src, token, body string) int {
		code, _ := sendReport(t, fromAddr(src), r.admin, token, body)
		return code
	}
	if code := post("127.0.6.8", tok["liar"], body); code != http.StatusBadRequest {
		t.Fatalf("a body naming network B: %d, want 400", code)
	}
	if code := post("127.0.6.7", "no-such-token-0123456789", body); code != http.StatusUnauthorized {
		t.Fatalf("an unknown token: %d, want 401", code)
	}
	if code := post("127.0.6.6", tok["liar"], strings.Repeat(" ", 2048)+"{}"); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body above report_max_body: %d, want 413", code)
	}
	var flood []string
	for i := range 20 {
		flood = append(flood, fmt.Sprintf("127.0.8.%d", i+1))
	}
	limited := 0
	for _, c := range burst(flood, tok["flooder"], [3]float64{1, 1, 1}) {
		if c == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited < 15-1 { // the burst of 5, and at most one refill in the flood
		t.Fatalf("flood of 20 with one token: %d refused with 429, want about 15", limited)
	}
	check("after the refused reports")
	for reason, want := range map[string]float64{"malformed": 1, "unauthorized": 1, "too_large": 1, "rate_limited_token": float64(limited)} {
		if n := metricWith(t, r.metrics, "coredns_ogs_reports_total", `result="`+reason+`"`); n != want {
			t.Errorf("reports_total{result=%q} %v, want %v", reason, n, want)
		}
	}
}
