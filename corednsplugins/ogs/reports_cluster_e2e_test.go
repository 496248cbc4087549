package ogs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	var gws []string
	for i, ms := range rtts {
		gws = append(gws, fmt.Sprintf(`{"name":"gw%d.example.test","rtt_ms":%g}`, i+1, ms))
	}
	body := fmt.Sprintf(`{"probe":"http","time":%q,"gateways":[%s]}`, time.Now().UTC().Format(time.RFC3339), strings.Join(gws, ","))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+admin+"/ogs/reports", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("report from %s: %v", src, err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// metricWith sums the samples of name whose labels contain label.
func metricWith(t *testing.T, addr, name, label string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
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
	resp, err := http.Get("http://" + addr + "/ogs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v reportsAdmin
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
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
