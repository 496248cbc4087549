package ogs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// replica is one bin/coredns of the cluster with its metrics and admin
// addresses.
type replica struct {
	*e2e.CoreDNS
	metrics, admin string
}

func clusterCorefile(gws []*countingGateway, redisAddr, metricsAddr, adminAddr, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vpn.example.test {\n\tbind 127.0.0.1\n\togs {\n")
	for i, g := range gws {
		fmt.Fprintf(&b, "\t\tgateway gw%d.example.test %s\n", i+1, g.Addr)
	}
	// No re-check: every connection a gateway counts is a probe run's.
	fmt.Fprintf(&b, "\t\tprobe http /\n\t\tprobes 2\n\t\trecheck off\n%s", extra)
	fmt.Fprintf(&b, "\t\tstore redis {\n\t\t\taddress %s\n\t\t\tkey_prefix e2e\n\t\t}\n", redisAddr)
	fmt.Fprintf(&b, "\t\tadmin %s\n\t}\n\tprometheus %s\n}\n", adminAddr, metricsAddr)
	return b.String()
}

// clusterGateways are three counting gateways whose measured order is
// 127.0.0.12, .13, .11: 100, 200 and 300 ms, far enough apart that a loaded
// machine does not swap two of them (10, 20 and 30 ms did: a probe of the
// 10 ms gateway measured over 20 ms in a busy make test; so did 30, 60 and
// 90 ms: with two busy loops on the two cores, 3 in 12 runs of
// TestClusterRedisDownAndBack measured the 60 ms gateway behind the 90 ms
// one while some 20 probe runs went at once).
func clusterGateways(t *testing.T) []*countingGateway {
	return []*countingGateway{startCountingGateway(t, "127.0.0.11", 300*ms), startCountingGateway(t, "127.0.0.12", 100*ms), startCountingGateway(t, "127.0.0.13", 200*ms)}
}

func startReplica(t *testing.T, gws []*countingGateway, redisAddr, extra string) *replica {
	r := &replica{metrics: e2e.Addr(t), admin: e2e.Addr(t)}
	r.CoreDNS = e2e.StartCoreDNS(t, clusterCorefile(gws, redisAddr, r.metrics, r.admin, extra), "other.example.test A")
	return r
}

// adminJSON is the admin view, as the README documents it.
type adminJSON struct {
	Servers []struct {
		Zone         string `json:"zone"`
		Store        string `json:"store"`
		RedisHealthy *bool  `json:"redis_healthy"`
		Gateways     []struct {
			Name    string `json:"name"`
			Address string `json:"address"`
		} `json:"gateways"`
		Locations []struct {
			Location   string             `json:"location"`
			Order      []string           `json:"order"`
			RTTsMs     map[string]float64 `json:"rtts_ms"`
			ProbedAt   time.Time          `json:"probed_at"`
			AgeSeconds float64            `json:"age_seconds"`
			Source     string             `json:"source"`
			Fresh      bool               `json:"fresh"`
		} `json:"locations"`
		LocationsTotal int        `json:"locations_total"`
		LastRun        *time.Time `json:"last_run"`
		RunsTotal      int        `json:"runs_total"`
	} `json:"servers"`
}

func fetchAdmin(t *testing.T, addr string) adminJSON {
	t.Helper()
	var v adminJSON
	getAdmin(t, addr, &v)
	return v
}

// getAdmin decodes the admin view at addr into v (the README's JSON).
func getAdmin(t *testing.T, addr string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/ogs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /ogs: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// query asks for vpn.example.test A from an ECS subnet and wants NOERROR
// with records; it returns the addresses and the TTL.
func query(t *testing.T, addr, subnet string) ([]string, uint32) {
	t.Helper()
	resp := ask(t, addr, "vpn.example.test", dns.TypeA, subnet)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Fatalf("%s from %s: %s with %d records", addr, subnet, dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
	return aRecords(resp)
}

func storeKey(subnet string) string { return "e2e:ogs:vpn.example.test.:ecs:" + subnet }

// Two replicas sharing one redis-server: a location probed by one is
// answered by the other from the store with no probe reaching a gateway,
// then from its own memory; a malformed value in Redis is ignored, counted
// and replaced; the admin view shows what was probed, on both.
func TestClusterSharesProbeResults(t *testing.T) {
	e2e.SkipShort(t)
	// 100, 200, 300 ms apart: with 20, 40 and 60 ms a loaded host swapped
	// two of them in a run (measured 60 below 40).
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	a, b := startReplica(t, gws, redisAddr, ""), startReplica(t, gws, redisAddr, "")
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}

	ips, ttl := query(t, a.Addr, "10.1.0.0/24")
	if !slices.Equal(ips, want) || ttl != 30 || totalConns(gws...) != 6 {
		t.Fatalf("replica a: %v ttl %d after %d probes; want %v, ttl 30, 6 probes", ips, ttl, totalConns(gws...), want)
	}
	// The value is written once the run's queries have their answer.
	a.WaitFor(t, "the result in Redis", 30*time.Second, func() error {
		return rdb.Get(ctx, storeKey("10.1.0.0/24")).Err()
	})
	ips, ttl = query(t, b.Addr, "10.1.0.0/24")
	if !slices.Equal(ips, want) || ttl != 30 {
		t.Fatalf("replica b: %v ttl %d, want a's %v with the full ttl", ips, ttl, want)
	}
	if n := totalConns(gws...); n != 6 {
		t.Fatalf("%d probes after replica b's first query; want none of its own (6 in all)", n)
	}
	query(t, b.Addr, "10.1.0.0/24")
	if redisHits, localHits := metric(t, b.metrics, `coredns_ogs_store_hits_total{level="redis"}`), metric(t, b.metrics, `coredns_ogs_store_hits_total{level="local"}`); redisHits != 1 || localHits != 1 {
		t.Fatalf("replica b: %v redis hits, %v local hits; want 1 and 1", redisHits, localHits)
	}
	if runs := metric(t, b.metrics, "coredns_ogs_probe_runs_total"); runs != 0 {
		t.Fatalf("replica b made %v probe runs", runs)
	}
	txt := dig(t, b.Addr, "_ogs.vpn.example.test", "TXT", "+short", "+subnet=10.1.0.0/24")
	if !strings.Contains(txt, "Results obtained from OGS cache") {
		t.Fatalf("replica b's TXT: %s", txt)
	}

	checkAdminViewsAgree(t, a, b)
	checkMalformedValuesReplaced(t, rdb, a, gws, want)
}

// checkAdminViewsAgree checks the admin views of two replicas after b
// answered a's result: the same location, order, RTTs and time on both; one
// run, on a.
func checkAdminViewsAgree(t *testing.T, a, b *replica) {
	t.Helper()
	va, vb := fetchAdmin(t, a.admin), fetchAdmin(t, b.admin)
	for name, v := range map[string]adminJSON{"a": va, "b": vb} {
		if len(v.Servers) != 1 {
			t.Fatalf("%s: %d servers", name, len(v.Servers))
		}
		s := v.Servers[0]
		if s.Zone != "vpn.example.test." || s.Store != "redis" || s.RedisHealthy == nil || !*s.RedisHealthy || len(s.Gateways) != 3 ||
			s.Gateways[1].Name != "gw2.example.test" || s.Gateways[1].Address != "127.0.0.12" || s.LocationsTotal != 1 || len(s.Locations) != 1 {
			t.Fatalf("%s: %+v", name, s)
		}
		l := s.Locations[0]
		if l.Location != "ecs:10.1.0.0/24" || !slices.Equal(l.Order, []string{"gw2.example.test", "gw3.example.test", "gw1.example.test"}) || !l.Fresh ||
			l.RTTsMs["gw2.example.test"] < 100 || l.RTTsMs["gw1.example.test"] < 300 || l.AgeSeconds < 0 || time.Since(l.ProbedAt) > time.Minute {
			t.Fatalf("%s: location %+v", name, l)
		}
	}
	la, lb := va.Servers[0].Locations[0], vb.Servers[0].Locations[0]
	if !la.ProbedAt.Equal(lb.ProbedAt) || la.RTTsMs["gw2.example.test"] != lb.RTTsMs["gw2.example.test"] || la.Source != "probed" || lb.Source != "shared" {
		t.Fatalf("a's %+v and b's %+v differ", la, lb)
	}
	if va.Servers[0].RunsTotal != 1 || va.Servers[0].LastRun == nil || vb.Servers[0].RunsTotal != 0 || vb.Servers[0].LastRun != nil {
		t.Fatalf("runs: a %d (%v), b %d (%v)", va.Servers[0].RunsTotal, va.Servers[0].LastRun, vb.Servers[0].RunsTotal, vb.Servers[0].LastRun)
	}
}

// checkMalformedValuesReplaced puts values no replica wrote under the
// prefix: each is ignored, counted and replaced by a's run.
func checkMalformedValuesReplaced(t *testing.T, rdb *redis.Client, a *replica, gws []*countingGateway, want []string) {
	t.Helper()
	ctx := context.Background()
	// Another program's value under the prefix: ignored, counted, and
	// replaced by this run's result.
	rdb.Set(ctx, storeKey("10.5.0.0/24"), `{"v":1,"gateways":{"evil.example":"1.2.3.4:1"},"rtts_ms":{"evil.example":1}}`, time.Hour)
	if ips, _ := query(t, a.Addr, "10.5.0.0/24"); !slices.Equal(ips, want) || totalConns(gws...) != 12 {
		t.Fatalf("over a malformed value: %v after %d probes", ips, totalConns(gws...))
	}
	if n := metric(t, a.metrics, "coredns_ogs_store_malformed_total"); n != 1 {
		t.Fatalf("%v malformed values counted", n)
	}
	a.WaitFor(t, "the malformed value replaced", 30*time.Second, func() error {
		if v, _ := rdb.Get(ctx, storeKey("10.5.0.0/24")).Result(); !strings.Contains(v, `"gw2.example.test"`) || strings.Contains(v, "evil") {
			return fmt.Errorf("value %s", v)
		}
		return nil
	})
	// A key of another type: a bad value too, not a Redis that is down.
	rdb.HSet(ctx, storeKey("10.6.0.0/24"), "order", "gw1.example.test")
	if ips, _ := query(t, a.Addr, "10.6.0.0/24"); !slices.Equal(ips, want) || totalConns(gws...) != 18 {
		t.Fatalf("over a hash: %v after %d probes", ips, totalConns(gws...))
	}
	if bad, errs := metric(t, a.metrics, "coredns_ogs_store_malformed_total"), metric(t, a.metrics, "coredns_ogs_store_errors_total"); bad != 2 || errs != 0 {
		t.Fatalf("%v malformed values, %v store errors; want 2 and 0", bad, errs)
	}
	a.WaitFor(t, "the hash replaced", 30*time.Second, func() error {
		if typ := rdb.Type(ctx, storeKey("10.6.0.0/24")).Val(); typ != "string" {
			return fmt.Errorf("type %s", typ)
		}
		return nil
	})
	if ttl := rdb.PTTL(ctx, storeKey("10.5.0.0/24")).Val(); ttl < 13*24*time.Hour || ttl > 14*24*time.Hour {
		t.Fatalf("value TTL %v, want the cache lifetime (14d)", ttl)
	}
}

// First queries for one new location on both replicas at once, a burst on
// each: one probe run in the whole cluster; the replica that lost the lock
// waits for the other's result and answers it with the full TTL.
func TestClusterConcurrentFirstQueriesProbeOnce(t *testing.T) {
	e2e.SkipShort(t)
	// Slow gateways, so that the replicas' first queries overlap the run.
	gws := []*countingGateway{startCountingGateway(t, "127.0.0.11", 900*ms), startCountingGateway(t, "127.0.0.12", 500*ms), startCountingGateway(t, "127.0.0.13", 700*ms)}
	_, redisAddr := e2e.StartRedis(t)
	extra := "\t\tanswer_deadline 6s\n"
	a, b := startReplica(t, gws, redisAddr, extra), startReplica(t, gws, redisAddr, extra)
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}

	var wg sync.WaitGroup
	start := make(chan struct{})
	type answer struct {
		ips []string
		ttl uint32
		err error
	}
	answers := make([]answer, 10)
	for i := range answers {
		addr := []string{a.Addr, b.Addr}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := exchange(addr, "vpn.example.test", dns.TypeA, "10.2.0.0/24")
			if err == nil && resp.Rcode != dns.RcodeSuccess {
				err = fmt.Errorf("rcode %s", dns.RcodeToString[resp.Rcode])
			}
			if err != nil {
				answers[i].err = err
				return
			}
			answers[i].ips, answers[i].ttl = aRecords(resp)
		}()
	}
	close(start)
	wg.Wait()
	for i, ans := range answers {
		if ans.err != nil || !slices.Equal(ans.ips, want) || ans.ttl != 30 {
			t.Errorf("query %d (replica %c): %v ttl %d err %v; want %v with ttl 30", i, "ab"[i%2], ans.ips, ans.ttl, ans.err, want)
		}
	}
	if n := totalConns(gws...); n != 6 {
		t.Fatalf("%d probes for one new location queried on both replicas; want one run (6)", n)
	}
	runs := metric(t, a.metrics, "coredns_ogs_probe_runs_total") + metric(t, b.metrics, "coredns_ogs_probe_runs_total")
	waits := metric(t, a.metrics, "coredns_ogs_cluster_lock_waits_total") + metric(t, b.metrics, "coredns_ogs_cluster_lock_waits_total")
	if runs != 1 || waits != 1 {
		t.Fatalf("%v probe runs, %v lock waits; want 1 and 1", runs, waits)
	}
}

// Redis killed mid-test: every query is still answered (none fails for
// Redis), each replica probes on its own, counts the errors and logs the
// outage once; after Redis returns on the same address, one replica's run
// serves the other again.
func TestClusterRedisDownAndBack(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	redisAddr, redisDir := e2e.Addr(t), t.TempDir()
	rp := e2e.StartRedisAt(t, redisDir, redisAddr)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	a, b := startReplica(t, gws, redisAddr, ""), startReplica(t, gws, redisAddr, "")
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	query(t, a.Addr, "10.1.0.0/24")
	a.WaitFor(t, "the result in Redis", 30*time.Second, func() error { return rdb.Get(ctx, storeKey("10.1.0.0/24")).Err() })

	rp.Kill()
	burstWithRedisDown(t, a, b)
	for _, r := range []*replica{a, b} {
		// Every new location was probed by each replica that got it, and
		// answered with its measured order.
		if ips, ttl := query(t, r.Addr, "10.3.0.0/24"); !slices.Equal(ips, want) || ttl != 30 {
			t.Fatalf("%s with Redis down: %v ttl %d", r.Addr, ips, ttl)
		}
		if n := metric(t, r.metrics, "coredns_ogs_store_errors_total"); n < 1 {
			t.Fatalf("%s: %v store errors counted", r.Addr, n)
		}
		if v := fetchAdmin(t, r.admin); *v.Servers[0].RedisHealthy {
			t.Fatalf("%s: admin says Redis is healthy", r.Addr)
		}
		if n := strings.Count(r.Logs(), "probing locally until it answers again"); n != 1 {
			t.Fatalf("%s: the outage logged %d times, want once:\n%s", r.Addr, n, r.Logs())
		}
	}

	e2e.StartRedisAt(t, redisDir, redisAddr) // empty: it kept nothing
	waitSharingAgain(t, rdb, a, b, gws, want)
	for _, r := range []*replica{a, b} {
		if v := fetchAdmin(t, r.admin); !*v.Servers[0].RedisHealthy {
			t.Fatalf("%s: admin says Redis is down after it returned", r.Addr)
		}
	}
	if !strings.Contains(a.Logs(), "answering again") {
		t.Fatalf("a did not log Redis' return:\n%s", a.Logs())
	}
}

// burstWithRedisDown sends 40 queries at once over both replicas while
// Redis is down: locations cached (answered from memory) and new ones
// (probed locally, the store failing under them); every one must be
// answered.
func burstWithRedisDown(t *testing.T, a, b *replica) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		addr := []string{a.Addr, b.Addr}[i%2]
		subnet := fmt.Sprintf("10.3.%d.0/24", i%10)
		if i%4 == 0 {
			subnet = "10.1.0.0/24"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := exchange(addr, "vpn.example.test", dns.TypeA, subnet)
			if err == nil && (resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0) {
				err = fmt.Errorf("rcode %s, %d records", dns.RcodeToString[resp.Rcode], len(resp.Answer))
			}
			if err != nil {
				errs <- fmt.Errorf("%s from %s with Redis down: %v", addr, subnet, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// waitSharingAgain waits, after Redis returned, for a location probed on a
// to be answered from Redis on b with no probe of b's own.
func waitSharingAgain(t *testing.T, rdb *redis.Client, a, b *replica, gws []*countingGateway, want []string) {
	t.Helper()
	ctx := context.Background()
	// Each replica leaves a failed store alone for a second; until both use
	// it again, a location probed on a is probed on b too. Wait for one
	// that is not, with a new location each time.
	i := 0
	a.WaitFor(t, "a location probed on a answered from Redis on b", 60*time.Second, func() error {
		i++
		subnet := fmt.Sprintf("10.4.%d.0/24", i)
		query(t, a.Addr, subnet)
		// Written right after the answer, unless a's store was still
		// resting: then try the next location.
		deadline := time.Now().Add(3 * time.Second)
		for rdb.Get(ctx, storeKey(subnet)).Err() != nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not stored", subnet)
			}
			time.Sleep(20 * ms)
		}
		before := totalConns(gws...)
		if ips, _ := query(t, b.Addr, subnet); !slices.Equal(ips, want) {
			t.Fatalf("b: %v", ips)
		}
		if n := totalConns(gws...) - before; n != 0 {
			return fmt.Errorf("%s: b probed (%d connections)", subnet, n)
		}
		return nil
	})
}

// A Redis that accepts connections and never answers: every query is still
// answered with the measured order and the full TTL (each Redis call gives
// up at its timeout, and the store then rests), the errors are counted and
// the admin view says Redis is not healthy.
func TestClusterRedisHanging(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	hanging, accepted := e2e.HangingListener(t, "127.0.0.1:0")
	r := startReplica(t, gws, hanging, "")
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := exchange(r.Addr, "vpn.example.test", dns.TypeA, fmt.Sprintf("10.7.%d.0/24", i%5))
			if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
				errs <- fmt.Errorf("query %d: %v %v", i, resp, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range 5 {
		if ips, ttl := query(t, r.Addr, fmt.Sprintf("10.7.%d.0/24", i)); !slices.Equal(ips, want) || ttl != 30 {
			t.Fatalf("10.7.%d.0/24: %v ttl %d", i, ips, ttl)
		}
	}
	if n := metric(t, r.metrics, "coredns_ogs_store_errors_total"); n < 1 || accepted.Load() < 1 {
		t.Fatalf("%v store errors, %d connections to the hanging Redis", n, accepted.Load())
	}
	if v := fetchAdmin(t, r.admin); *v.Servers[0].RedisHealthy {
		t.Fatal("admin says the hanging Redis is healthy")
	}
}

// A reload (the reload plugin) keeps the store in use: a location probed
// before it answers from memory, and one probed by another replica after
// it answers from Redis, with no probe of its own.
func TestClusterStoreAcrossReload(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	cf := func(ttl int) string {
		return strings.Replace(clusterCorefile(gws, redisAddr, e2e.Addr(t), e2e.Addr(t), fmt.Sprintf("\t\tttl %d\n", ttl)), "\tbind 127.0.0.1\n", "\tbind 127.0.0.1\n\treload 2s 0s\n", 1)
	}
	a := startReloadable(t, cf(30))
	b := startReplica(t, gws, redisAddr, "")
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	if ips, _ := aRecords(ask(t, a.addr, "vpn.example.test", dns.TypeA, "10.1.0.0/24")); !slices.Equal(ips, want) {
		t.Fatalf("a: %v", ips)
	}
	a.reload(t, cf(60), false)
	query(t, b.Addr, "10.2.0.0/24")
	b.WaitFor(t, "b's result in Redis", 30*time.Second, func() error { return rdb.Get(ctx, storeKey("10.2.0.0/24")).Err() })
	// b's order for 10.2.0.0/24 is b's own measurement: on a loaded host
	// two gateways can measure alike and swap, and a must answer b's order
	// whatever it is.
	bOrder, _ := aRecords(ask(t, b.Addr, "vpn.example.test", dns.TypeA, "10.2.0.0/24"))
	conns := totalConns(gws...)
	for subnet, want := range map[string][]string{"10.1.0.0/24": want, "10.2.0.0/24": bOrder} {
		if ips, ttl := aRecords(ask(t, a.addr, "vpn.example.test", dns.TypeA, subnet)); !slices.Equal(ips, want) || ttl != 60 {
			t.Fatalf("a after the reload, %s: %v ttl %d, want %v", subnet, ips, ttl, want)
		}
	}
	if n := totalConns(gws...) - conns; n != 0 {
		t.Fatalf("a probed after the reload (%d connections)", n)
	}
	txt := ask(t, a.addr, "_ogs.vpn.example.test", dns.TypeTXT, "10.2.0.0/24")
	if !strings.Contains(fmt.Sprint(txt.Answer), "Results obtained from OGS cache") {
		t.Fatalf("a's TXT: %v", txt.Answer)
	}
	if !strings.Contains(a.logs(), "Reloading complete") {
		t.Fatal("no reload")
	}
}
