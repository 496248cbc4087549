package ogs_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// startHTTPSGateway serves HTTPS on a free port of ip (httptest's
// certificate: the example's probe does not check it), answering after
// delay, and counts the connections it accepts: one per probe.
func startHTTPSGateway(t *testing.T, ip string, delay time.Duration) *countingGateway {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	g := &countingGateway{Addr: l.Addr().String()}
	g.delay.Store(int64(delay))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(time.Duration(g.delay.Load()))
		fmt.Fprintln(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			g.conns.Add(1)
		}
	}
	srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return g
}

// Corefile.examples/ogs-cluster.Corefile itself (only its addresses
// replaced) as two bin/coredns replicas sharing one redis-server, with
// real HTTPS gateways: a location probed by replica a is answered by
// replica b from the shared store, with no probe of its own reaching a
// gateway; the value sits in Redis under the example's key prefix for its
// cache lifetime (14d); both admin views show it, b's as shared.
func TestExampleOGSClusterSharesProbeResults(t *testing.T) {
	e2e.SkipShort(t)
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Corefile.examples", "ogs-cluster.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	// Delays far apart: TLS handshakes on a busy machine add their own.
	gws := []*countingGateway{
		startHTTPSGateway(t, "127.0.0.11", 400*ms),
		startHTTPSGateway(t, "127.0.0.12", 0),
		startHTTPSGateway(t, "127.0.0.13", 200*ms),
	}
	_, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()

	a, adminA := startExampleReplica(t, string(data), gws, redisAddr)
	b, adminB := startExampleReplica(t, string(data), gws, redisAddr)

	// records 1: the nearest gateway only.
	want := []string{"127.0.0.12"}
	ipsA, ttlA := query(t, a.Addr, "192.0.2.0/24")
	if !slices.Equal(ipsA, want) {
		t.Fatalf("replica a: %v, want %v", ipsA, want)
	}
	for i, g := range gws {
		if g.Conns() == 0 {
			t.Fatalf("replica a's run: no probe reached gw%d", i+1)
		}
	}
	probes := totalConns(gws...)
	key := "edgesteer:ogs:vpn.example.test.:ecs:192.0.2.0/24"
	a.WaitFor(t, "the result in Redis", 30*time.Second, func() error { return rdb.Get(ctx, key).Err() })
	if ttl := rdb.PTTL(ctx, key).Val(); ttl < 13*24*time.Hour || ttl > 14*24*time.Hour {
		t.Fatalf("%s expires in %v, want the example's cache_ttl (14d)", key, ttl)
	}

	ipsB, ttlB := query(t, b.Addr, "192.0.2.0/24")
	if !slices.Equal(ipsB, want) || ttlB != ttlA {
		t.Fatalf("replica b: %v ttl %d, want a's %v with the full ttl %d", ipsB, ttlB, want, ttlA)
	}
	if n := totalConns(gws...); n != probes {
		t.Fatalf("%d probes after replica b's query, %d before: b probed", n, probes)
	}

	// The same on a second location, b asked first for the diagnostic
	// TXT: it says where the answer came from.
	query(t, a.Addr, "198.51.100.0/24")
	a.WaitFor(t, "the second result in Redis", 30*time.Second, func() error {
		return rdb.Get(ctx, "edgesteer:ogs:vpn.example.test.:ecs:198.51.100.0/24").Err()
	})
	probes = totalConns(gws...)
	resp := ask(t, b.Addr, "_ogs.vpn.example.test", dns.TypeTXT, "198.51.100.0/24")
	var txt []string
	for _, rr := range resp.Answer {
		if r, ok := rr.(*dns.TXT); ok {
			txt = append(txt, r.Txt...)
		}
	}
	if !slices.Contains(txt, "Results obtained from the shared OGS cache (another replica's ping tests). No ping tests were performed.") {
		t.Fatalf("replica b's diagnostic TXT: %q", txt)
	}
	if n := totalConns(gws...); n != probes {
		t.Fatalf("%d probes after replica b's TXT query, %d before: b probed", n, probes)
	}

	checkExampleAdminViews(t, adminA, adminB)
}

// startExampleReplica starts the example's Corefile with the test's
// gateways, Redis and a free admin address in place of its own; it returns
// the server and its admin address.
func startExampleReplica(t *testing.T, corefile string, gws []*countingGateway, redisAddr string) (*e2e.CoreDNS, string) {
	t.Helper()
	admin := e2e.Addr(t)
	for _, r := range [][2]string{
		{"127.0.0.11:8443", gws[0].Addr}, {"127.0.0.12:8443", gws[1].Addr}, {"127.0.0.13:8443", gws[2].Addr},
		{"127.0.0.1:6379", redisAddr}, {"127.0.0.1:9254", admin},
	} {
		if !strings.Contains(corefile, r[0]) {
			t.Fatalf("the example no longer has %s: update this test", r[0])
		}
		corefile = strings.ReplaceAll(corefile, r[0], r[1])
	}
	// Ready when a name outside the zone is answered (REFUSED): no
	// query of the zone before the test's own.
	return e2e.StartCoreDNS(t, corefile, "other.example.test A"), admin
}

// checkExampleAdminViews checks the example's admin views after the test's
// queries: a probed both locations, b ran nothing and holds both as
// shared, with a's order; Redis healthy.
func checkExampleAdminViews(t *testing.T, adminA, adminB string) {
	t.Helper()
	va, vb := fetchAdmin(t, adminA), fetchAdmin(t, adminB)
	for name, v := range map[string]adminJSON{"a": va, "b": vb} {
		if len(v.Servers) != 1 {
			t.Fatalf("%s: %d servers", name, len(v.Servers))
		}
		s := v.Servers[0]
		if s.Zone != "vpn.example.test." || s.Store != "redis" || s.RedisHealthy == nil || !*s.RedisHealthy || len(s.Locations) != 2 {
			t.Fatalf("%s: %+v", name, s)
		}
		for _, l := range s.Locations {
			if !slices.Equal(l.Order, []string{"gw2.example.test", "gw3.example.test", "gw1.example.test"}) || !l.Fresh {
				t.Fatalf("%s: location %+v", name, l)
			}
			if src := map[string]string{"a": "probed", "b": "shared"}[name]; l.Source != src {
				t.Fatalf("%s: location %s has source %q, want %q", name, l.Location, l.Source, src)
			}
		}
	}
	if va.Servers[0].RunsTotal != 2 || vb.Servers[0].RunsTotal != 0 || vb.Servers[0].LastRun != nil {
		t.Fatalf("runs: a %d, b %d (last %v); want 2 and none", va.Servers[0].RunsTotal, vb.Servers[0].RunsTotal, vb.Servers[0].LastRun)
	}
}
