package latencybucket_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// faultCluster is the cluster of cluster_e2e_test.go (three bin/caddy
// replicas running the cluster example unchanged, so with the default
// sticky settings, three testpeer publishers equally near, each in its own
// network namespace) with a redis-server whose process the test holds, to
// stop (SIGSTOP) and resume it.
type faultCluster struct {
	*cluster
	redisCmd *exec.Cmd
}

func startFaultCluster(t *testing.T) *faultCluster {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "redis": 2, "r1": 3, "r2": 4, "r3": 5,
		"p1": 11, "p2": 12, "p3": 13})
	c := &faultCluster{cluster: &cluster{t: t, tp: tp, root: e2e.Root(t), replicas: map[string]*e2e.Proc{},
		redisDir: t.TempDir(), client: tp.HTTPClient("client")}}
	// ip netns exec replaces itself with redis-server: the PID is Redis'.
	c.redisCmd = tp.Command("redis", "redis-server", e2e.RedisArgs(c.redisDir, c.redisAddr())...)
	if err := c.redisCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.redisCmd.Process.Signal(syscall.SIGCONT)
		c.redisCmd.Process.Kill()
		c.redisCmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for c.redisPing() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server never answered PING")
		}
		time.Sleep(20 * ms)
	}
	pubs := c.startPublishers()
	// No STORE_TIMEOUT: the example's sticky_store_timeout is the default,
	// 50 ms; sticky_ttl 1h is the default too.
	c.env = []string{"REDIS_ADDRESS=" + c.redisAddr(), "PUBLISHERS=" + pubs, "PROBE_INTERVAL=300ms"}
	for _, h := range replicaHosts {
		c.startReplica(h)
		if v, _ := c.view(h); v.StickyStore.TimeoutMS != 50 {
			t.Fatalf("%s: sticky_store_timeout %v ms, want the default 50", h, v.StickyStore.TimeoutMS)
		}
	}
	return c
}

// busyLoops keeps n CPU-bound shell loops running beside the test (each
// bounded by timeout(1), and stopped by its PID when the test ends).
func busyLoops(t *testing.T, n int) {
	for range n {
		cmd := exec.Command("timeout", "600", "sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM) // timeout passes it on to the loop
			cmd.Wait()
		})
	}
}

// pairLog is every answer of a burst, per pair and per replica, in order.
type pairLog map[[2]string]map[string][]string

// burstLog is cluster.burst, keeping which replica answered.
func (c *cluster) burstLog(log pairLog, users, apps []string, rounds int) {
	c.t.Helper()
	c.each(users, apps, rounds, func(pair [2]string, host, peer string) {
		if log[pair] == nil {
			log[pair] = map[string][]string{}
		}
		log[pair][host] = append(log[pair][host], peer)
	})
}

// split returns the pairs that went to more than one publisher.
func (l pairLog) split() [][2]string {
	var out [][2]string
	for pair, byHost := range l {
		seen := map[string]bool{}
		for _, peers := range byHost {
			for _, p := range peers {
				seen[p] = true
			}
		}
		if len(seen) > 1 {
			out = append(out, pair)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0]+out[i][1] < out[j][0]+out[j][1] })
	return out
}

// switches returns the most times one replica changed a pair's publisher.
func (l pairLog) switches() (most int, worst string) {
	for pair, byHost := range l {
		for host, peers := range byHost {
			n := 0
			for i := 1; i < len(peers); i++ {
				if peers[i] != peers[i-1] {
					n++
				}
			}
			if n > most {
				most, worst = n, fmt.Sprintf("%v on %s: %v", pair, host, peers)
			}
		}
	}
	return most, worst
}

// last is each replica's last answer for the pair: do they agree?
func (l pairLog) disagreeing() [][2]string {
	var out [][2]string
	for pair, byHost := range l {
		seen := map[string]bool{}
		for _, peers := range byHost {
			seen[peers[len(peers)-1]] = true
		}
		if len(seen) > 1 {
			out = append(out, pair)
		}
	}
	return out
}

func (l pairLog) describe(pairs [][2]string, n int) string {
	var b strings.Builder
	for i, p := range pairs {
		if i == n {
			fmt.Fprintf(&b, " … (%d more)", len(pairs)-n)
			break
		}
		fmt.Fprintf(&b, " %v=%v", p, l[p])
	}
	return b.String()
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// stickyStoreCaddyfile is a loopback replica at front: policy name over
// pubs with sticky_store redis main (store: the lines of its
// edgesteer_redis block), the publisher in X-Publisher.
func stickyStoreCaddyfile(store, front, name string, pubs []string) string {
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
}
http://app.example:%s {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy latency_bucket {
			name %s
			probe_interval 300ms
			sticky_user {http.request.header.X-User}
			sticky_store redis main
		}
		header_down X-Publisher {http.reverse_proxy.latency_bucket.publisher}
	}
}
`, store, port(front), strings.Join(pubs, " "), name)
}

func (c *cluster) storeViews() map[string]latencybucket.StoreView {
	out := map[string]latencybucket.StoreView{}
	for _, h := range replicaHosts {
		v, err := c.view(h)
		if err != nil || v.StickyStore == nil {
			c.t.Fatalf("%s view: %+v %v", h, v, err)
		}
		out[h] = *v.StickyStore
	}
	return out
}

// The default sticky settings on a CPU-loaded host (two busy loops beside
// three replicas, Redis, the publishers and the clients on two cores):
// 1000 (user, app) pairs, 500 users at once rotating over the replicas,
// each pair visiting each replica twice. At least 99.9 % of the pairs are
// on one publisher on every request, none is switched more than once by a
// replica, and at the end every replica sends every pair to one publisher.
// Redis is never marked unreachable. (With "one slow answer marks the
// store down" a quarter to most of the pairs split here.)
func TestClusterStickyDefaultsUnderCPULoad(t *testing.T) {
	c := startFaultCluster(t)
	busyLoops(t, 2)
	users, apps := names("load", 500), []string{"app1.example", "app2.example"}
	log := pairLog{}
	start := time.Now()
	c.burstLog(log, users, apps, 6)
	elapsed := time.Since(start)
	views := c.storeViews()
	split := log.split()
	most, worst := log.switches()
	t.Logf("%d pairs, %d requests in %v under load: %d split, at most %d switches per replica (%s); views %+v",
		len(log), len(log)*6, elapsed, len(split), most, worst, views)
	if len(log) != 1000 {
		t.Fatalf("%d pairs answered", len(log))
	}
	if len(split) > 1 { // 99.9 % of 1000
		t.Fatalf("%d of %d pairs went to more than one publisher:%s", len(split), len(log), log.describe(split, 5))
	}
	if most > 1 {
		t.Fatalf("a replica switched a pair %d times: %s", most, worst)
	}
	if d := log.disagreeing(); len(d) > 0 {
		t.Fatalf("%d pairs end on different publishers on different replicas:%s", len(d), log.describe(d, 5))
	}
	for h, v := range views {
		if !v.Healthy || strings.Contains(c.replicas[h].Logs(), "sticky store unreachable") {
			t.Fatalf("%s: Redis marked unreachable under CPU load: %+v", h, v)
		}
	}
}

// A store outage of a few seconds (redis-server stopped with SIGSTOP: its
// connections hang) under bursts of new pairs: no request fails, known
// pairs keep their publisher, each replica marks Redis unreachable once
// and back once (logged once each); the pairs made during the outage were
// picked by each replica on its own, and once Redis answers again they
// converge: every replica sends each to one publisher, and no replica
// switches a pair more than once.
func TestClusterStickyStoreOutage(t *testing.T) {
	c := startFaultCluster(t)
	apps := []string{"app1.example", "app2.example"}
	before := pairLog{}
	c.burstLog(before, names("before", 30), apps, 3)
	if s := before.split(); len(s) > 0 {
		t.Fatalf("before the outage, %d pairs split:%s", len(s), before.describe(s, 5))
	}

	if err := c.redisCmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	during := pairLog{}
	duringUsers := names("during", 60)
	known := pairLog{}
	for time.Since(stopped) < 3*time.Second {
		c.burstLog(during, duringUsers, apps, 3)
		c.burstLog(known, names("before", 30), apps, 1)
	}
	for _, h := range replicaHosts {
		c.waitView(h, func(v latencybucket.PolicyView) bool { return !v.StickyStore.Healthy }, "Redis unreachable")
	}
	// Once more with every replica knowing Redis down (a loaded host may
	// have got there only after the bursts above). The pairs made above
	// are local hits now, which call no store. New pairs skip it: on each
	// replica, each new pair's lookup and claim are not made, and counted.
	// (On a loaded host every call above may have been made, and timed
	// out, before a replica marked Redis down.)
	downUsers := names("down", 10)
	skipped := map[string]uint64{}
	for h, v := range c.storeViews() {
		skipped[h] = v.Skipped
	}
	c.burstLog(during, downUsers, apps, 3)
	for h, v := range c.storeViews() {
		if got, want := v.Skipped-skipped[h], uint64(2*len(downUsers)*len(apps)); got < want {
			t.Fatalf("%s skipped %d store calls for %d new pairs while Redis was down, want ≥ %d: %+v", h, got, len(downUsers)*len(apps), want, v)
		}
	}
	c.burstLog(during, duringUsers, apps, 3)
	c.burstLog(known, names("before", 30), apps, 1)
	for pair, byHost := range known {
		want := before[pair]["r1"][0]
		for h, peers := range byHost {
			for _, p := range peers {
				if p != want {
					t.Fatalf("during the outage %v left %s for %s on %s", pair, want, p, h)
				}
			}
		}
	}
	if err := c.redisCmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("Redis stopped for %v; %d pairs made during it, %d of them split", time.Since(stopped), len(during),
		len(during.split()))
	for _, h := range replicaHosts {
		c.waitView(h, func(v latencybucket.PolicyView) bool { return v.StickyStore.Healthy }, "Redis healthy again")
	}

	// After: the pairs made during the outage, each replica twice, all at once.
	after := pairLog{}
	outageUsers := slices.Concat(duringUsers, downUsers)
	c.burstLog(after, outageUsers, apps, 6)
	if d := after.disagreeing(); len(d) > 0 {
		t.Fatalf("%d pairs made during the outage still end on different publishers:%s", len(d), after.describe(d, 5))
	}
	final := pairLog{}
	c.burstLog(final, outageUsers, apps, 3)
	if s := final.split(); len(s) > 0 {
		t.Fatalf("after reconciliation %d pairs are still split:%s", len(s), final.describe(s, 5))
	}
	// One replica switches a pair at most once, over the whole story.
	whole := pairLog{}
	for _, l := range []pairLog{during, after, final} {
		for pair, byHost := range l {
			if whole[pair] == nil {
				whole[pair] = map[string][]string{}
			}
			for h, peers := range byHost {
				whole[pair][h] = append(whole[pair][h], peers...)
			}
		}
	}
	if most, worst := whole.switches(); most > 1 {
		t.Fatalf("a replica switched a pair %d times: %s", most, worst)
	}
	var reconciled, adopted uint64
	for h, v := range c.storeViews() {
		reconciled += v.Reconciled
		adopted += v.ReconcileAdopted
		if v.Pending != 0 || v.ErrorsByReason["timeout"] == 0 || v.Skipped == 0 {
			t.Fatalf("%s after the outage: %+v", h, v)
		}
		logs := c.replicas[h].Logs()
		if n := strings.Count(logs, "sticky store unreachable"); n != 1 {
			t.Fatalf("%s logged Redis unreachable %d times:\n%s", h, n, logs)
		}
		if n := strings.Count(logs, "sticky store is back"); n != 1 {
			t.Fatalf("%s logged Redis back %d times", h, n)
		}
	}
	// (Replicas that see the same bucket make the same rendezvous pick, so
	// here they agreed even without Redis and nothing needed adopting; the
	// unit test TestStickyStoreSlowAnswerIsNotDown covers adoption.)
	if reconciled+adopted < uint64(len(during)) {
		t.Fatalf("reconciled %d, adopted %d, for %d pairs made during the outage", reconciled, adopted, len(during))
	}
	t.Logf("reconciled: %d kept, %d switched to another replica's pin", reconciled, adopted)
}

// An ACL user that may touch only part of the policy's keys (users
// "a-…"): those pairs are shared; the others get NOPERM, and by the
// documented fallback are picked and pinned on each replica alone, with
// no request failing and at most one store attempt per pair per second.
// Redis is not marked unreachable; the admin view, the metrics
// (store_errors_total{reason="noperm"}, store_refusing) and one log line
// per replica name the refusal and a refused key. When the ACL is fixed,
// the refusal ends (logged once) and the refused pairs converge.
func TestClusterStickyStoreACLRefusesSomeKeys(t *testing.T) {
	_, redisAddr := e2e.StartRedis(t)
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.Do(ctx, "ACL", "SETUSER", "lb", "on", ">pw", "~edgesteer:latency_bucket:acl:a-*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	pubs, _ := publishers(t, 0, 0, 0)
	fronts := []string{e2e.Addr(t), e2e.Addr(t)}
	var caddies []*e2e.Caddy
	for _, f := range fronts {
		c := e2e.StartCaddy(t, "caddyfile", stickyStoreCaddyfile(redisAddr+"\n\t\tusername lb\n\t\tpassword pw", f, "acl", pubs))
		c.WaitTCP(t, f)
		adminView(t, c, "acl", 3)
		caddies = append(caddies, c)
	}
	get := func(i int, user string) string {
		req, _ := http.NewRequest("GET", "http://"+fronts[i]+"/", nil)
		req.Host = "app.example" // one app on both replicas (the default sticky_app is the host)
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s on replica %d: %v", user, i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s on replica %d: %s", user, i, resp.Status)
		}
		return resp.Header.Get("X-Publisher")
	}
	view := func(i int) latencybucket.StoreView {
		var v []latencybucket.PolicyView
		caddies[i].AdminJSON(t, "/latency_bucket/", &v)
		if len(v) != 1 || v[0].StickyStore == nil {
			t.Fatalf("view %+v", v)
		}
		return *v[0].StickyStore
	}
	allowed, refused := names("a", 20), names("b", 20)
	pins := map[string][2]string{}
	for _, u := range append(append([]string{}, allowed...), refused...) {
		var p [2]string
		for round := range 4 {
			got := get(round%2, u)
			if round < 2 {
				p[round] = got
			} else if got != p[round%2] {
				t.Fatalf("%s left its pin %s on replica %d for %s", u, p[round%2], round%2, got)
			}
		}
		pins[u] = p
	}
	for _, u := range allowed {
		if pins[u][0] != pins[u][1] {
			t.Fatalf("allowed %s split across replicas: %v", u, pins[u])
		}
	}
	for i := range caddies {
		v := view(i)
		if !v.Healthy || !v.Refusing || v.RefusedReason != "noperm" || v.ErrorsByReason["noperm"] == 0 ||
			!strings.HasPrefix(v.RefusedKey, "edgesteer:latency_bucket:acl:b-") || v.Pending == 0 {
			t.Fatalf("replica %d view with the ACL refusing b-*: %+v", i, v)
		}
		if n, ok := caddies[i].Metric(t, `caddy_edgesteer_latency_bucket_store_errors_total{policy="acl",reason="noperm"}`); !ok || n == 0 {
			t.Fatalf("replica %d: noperm errors metric %v %v", i, n, ok)
		}
		if n, ok := caddies[i].Metric(t, `caddy_edgesteer_latency_bucket_store_refusing{policy="acl"}`); !ok || n != 1 {
			t.Fatalf("replica %d: refusing metric %v %v", i, n, ok)
		}
		logs := caddies[i].Logs()
		if n := strings.Count(logs, "sticky store refuses keys"); n != 1 || !strings.Contains(logs, `"reason":"noperm"`) {
			t.Fatalf("replica %d logged the refusal %d times:\n%s", i, n, logs)
		}
		if strings.Contains(logs, "sticky store unreachable") {
			t.Fatalf("replica %d marked Redis unreachable for refused keys", i)
		}
	}
	// A refused pair's hits retry the store at most once a second.
	errs := view(0).Errors
	start := time.Now()
	for range 100 {
		get(0, refused[0])
	}
	if n, most := view(0).Errors-errs, 2*(int(time.Since(start)/time.Second)+1); int(n) > most {
		t.Fatalf("100 requests of a refused pair made %d failed store calls in %v", n, time.Since(start))
	}
	keys, _ := rc.Keys(ctx, "edgesteer:latency_bucket:acl:*").Result()
	if len(keys) != len(allowed) {
		t.Fatalf("keys in Redis: %v, want the %d allowed pairs", keys, len(allowed))
	}

	// The ACL fixed: within the refusal hold (10 s) and a reconciliation
	// per pair, the refused pairs are written and converge.
	if err := rc.Do(ctx, "ACL", "SETUSER", "lb", "allkeys").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		same := 0
		for _, u := range refused {
			if get(0, u) == get(1, u) {
				same++
			}
		}
		if same == len(refused) && !view(0).Refusing && !view(1).Refusing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the ACL was fixed: %d of %d refused pairs agree; views %+v %+v", same, len(refused), view(0), view(1))
		}
		time.Sleep(500 * ms)
	}
	for i := range caddies {
		if n := strings.Count(caddies[i].Logs(), "sticky store accepts keys again"); n != 1 {
			t.Fatalf("replica %d logged the end of the refusal %d times", i, n)
		}
		if v := view(i); v.Pending != 0 {
			t.Fatalf("replica %d: %d pins still pending", i, v.Pending)
		}
	}
}
