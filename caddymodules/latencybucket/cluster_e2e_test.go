package latencybucket_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// cluster is three bin/caddy replicas running the cluster example, a real
// redis-server and three testpeer publishers, each in its own network
// namespace, and a client namespace the requests come from.
type cluster struct {
	t        *testing.T
	tp       *e2e.Topology
	root     string
	env      []string
	replicas map[string]*e2e.Proc
	redis    *e2e.Proc
	redisDir string
	client   *http.Client
}

var replicaHosts = []string{"r1", "r2", "r3"}

func (c *cluster) redisAddr() string { return c.tp.IP("redis") + ":6379" }

func (c *cluster) startRedis() {
	c.redis = c.tp.Start(c.t, "redis", "redis", "redis-server", nil, e2e.RedisArgs(c.redisDir, c.redisAddr())...)
	c.redis.WaitFor(c.t, "redis PING", 30*time.Second, c.redisPing)
}

// redisPing sends PING from the client namespace.
func (c *cluster) redisPing() error {
	conn, err := c.tp.Dialer("client", nil)(context.Background(), "tcp", c.redisAddr())
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	conn.Write([]byte("PING\r\n"))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "+PONG\r\n" {
		return fmt.Errorf("PING: %q %v", line, err)
	}
	return nil
}

func (c *cluster) startReplica(host string) {
	cf, err := os.ReadFile(filepath.Join(c.root, "Caddyfile.examples", "publisher-selection-cluster.Caddyfile"))
	if err != nil {
		c.t.Fatal(err)
	}
	env := append([]string{"BIND=" + c.tp.IP(host)}, c.env...)
	c.replicas[host] = c.tp.StartCaddy(c.t, host, string(cf), c.root, env)
	c.waitView(host, func(v latencybucket.PolicyView) bool {
		measured := 0
		for _, p := range v.Publishers {
			if p.Measured {
				measured++
			}
		}
		return measured == 3 && v.StickyStore != nil
	}, "3 measured publishers")
}

// view reads a replica's admin view of the policy apps.
func (c *cluster) view(host string) (latencybucket.PolicyView, error) {
	resp, err := c.tp.HTTPClient(host).Get("http://127.0.0.1:2019/latency_bucket/")
	if err != nil {
		return latencybucket.PolicyView{}, err
	}
	defer resp.Body.Close()
	var views []latencybucket.PolicyView
	if err := json.NewDecoder(resp.Body).Decode(&views); err != nil {
		return latencybucket.PolicyView{}, err
	}
	for _, v := range views {
		if v.Name == "apps" {
			return v, nil
		}
	}
	return latencybucket.PolicyView{}, fmt.Errorf("no policy apps in %+v", views)
}

func (c *cluster) waitView(host string, ok func(latencybucket.PolicyView) bool, what string) latencybucket.PolicyView {
	c.t.Helper()
	var last latencybucket.PolicyView
	var err error
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if last, err = c.view(host); err == nil && ok(last) {
			return last
		}
		time.Sleep(100 * ms)
	}
	c.t.Fatalf("%s: never %s: %+v %v", host, what, last, err)
	return last
}

// get sends one request for (user, app) to a replica and returns the
// publisher that answered and the decision.
func (c *cluster) get(host, user, app string) (peer, decision string, err error) {
	req, _ := http.NewRequest("GET", "http://"+c.tp.IP(host)+":8080/", nil)
	req.Host = app
	req.Header.Set("X-User", user)
	resp, err := c.client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return "", "", fmt.Errorf("%s: status %s", host, resp.Status)
	}
	return resp.Header.Get("X-Peer"), resp.Header.Get("X-Publisher-Decision"), nil
}

// burst makes every user (all at once) send rounds requests per app,
// rotating over the replicas (user i starts at replica i mod 3), and
// returns each pair's publishers in order. Any failed request fails the
// test.
func (c *cluster) burst(users []string, apps []string, rounds int) map[[2]string][]string {
	c.t.Helper()
	out := map[[2]string][]string{}
	c.each(users, apps, rounds, func(pair [2]string, _, peer string) {
		out[pair] = append(out[pair], peer)
	})
	return out
}

// each runs the requests of burst and hands every answer to record, one
// at a time; any failed request fails the test.
func (c *cluster) each(users []string, apps []string, rounds int, record func(pair [2]string, host, peer string)) {
	c.t.Helper()
	var mu sync.Mutex
	var failures []error
	e2e.Together(len(users), func(i int) {
		user := users[i]
		for r := range rounds {
			for _, app := range apps {
				host := replicaHosts[(i+r)%len(replicaHosts)]
				peer, _, err := c.get(host, user, app)
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Errorf("%s %s on %s: %v", user, app, host, err))
				} else {
					record([2]string{user, app}, host, peer)
				}
				mu.Unlock()
			}
		}
	})
	if len(failures) > 0 {
		c.t.Fatalf("%d requests failed, first: %v", len(failures), failures[0])
	}
}

// startPublishers starts testpeer publishers in namespaces p1, p2 and p3,
// waits until each accepts, and returns their addresses, space-separated.
func (c *cluster) startPublishers() string {
	c.t.Helper()
	var pubs string
	for i, h := range []string{"p1", "p2", "p3"} {
		addr := c.tp.IP(h) + ":9001"
		name := fmt.Sprintf("publisher-%d", i+1)
		p := c.tp.Start(c.t, h, name, e2e.Bin(c.t, "testpeer"), nil, "-listen", addr, "-name", name)
		p.WaitFor(c.t, "publisher", 30*time.Second, func() error {
			conn, err := c.tp.Dialer("client", nil)(context.Background(), "tcp", addr)
			if err == nil {
				conn.Close()
			}
			return err
		})
		pubs += " " + addr
	}
	return pubs
}

// consistent fails the test unless every pair went to one publisher; it
// returns the pairs' publishers and how many distinct publishers they use.
func consistent(t *testing.T, what string, got map[[2]string][]string) (map[[2]string]string, int) {
	t.Helper()
	pinned := map[[2]string]string{}
	used := map[string]bool{}
	for pair, peers := range got {
		for _, p := range peers {
			if p != peers[0] {
				t.Fatalf("%s: pair %v went to %v across the replicas", what, pair, peers)
			}
		}
		pinned[pair] = peers[0]
		used[peers[0]] = true
	}
	return pinned, len(used)
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// Three replicas with the same Caddyfile (sticky_store redis) share their
// pins through a real redis-server: 50 users hitting the replicas in turn,
// all at once, keep one publisher per (user, app) on all three; a replica
// restarted with an empty table still sends them there; with Redis killed
// no request fails and picks go on locally; once Redis is back, new pairs
// are shared again.
func TestClusterStickinessThroughRedis(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "redis": 2, "r1": 3, "r2": 4, "r3": 5,
		"p1": 11, "p2": 12, "p3": 13})
	c := &cluster{t: t, tp: tp, root: e2e.Root(t), replicas: map[string]*e2e.Proc{}, redisDir: t.TempDir(),
		client: tp.HTTPClient("client")}
	c.startRedis()
	pubs := c.startPublishers()
	// The publishers are equally near (all in [0,32)), so each replica
	// alone would pick at random: only the shared store makes them agree.
	// The store timeout is raised from the example's 50ms: on a loaded
	// 2-core machine a slow answer would (rightly) mark Redis down, which
	// is not what this test is about.
	c.env = []string{"REDIS_ADDRESS=" + c.redisAddr(), "PUBLISHERS=" + pubs, "PROBE_INTERVAL=300ms", "STORE_TIMEOUT=2s"}
	for _, h := range replicaHosts {
		c.startReplica(h)
	}

	users, apps := names("user", 50), []string{"app1.example", "app2.example"}
	pinned, used := consistent(t, "first burst", c.burst(users, apps, 6))
	if used < 2 {
		t.Fatalf("100 pairs all on one publisher: the picks are not random, the test proves nothing: %v", pinned)
	}
	total := map[string]uint64{}
	for _, h := range replicaHosts {
		v, err := c.view(h)
		if err != nil {
			t.Fatal(err)
		}
		s := v.StickyStore
		if !s.Healthy || s.HitsRedis == 0 || s.HitsLocal == 0 || s.Errors != 0 || s.Malformed != 0 {
			t.Fatalf("%s store view: %+v", h, s)
		}
		total["writes"] += s.Writes
		total["redis"] += s.HitsRedis
		total["adopted"] += s.Adopted
		for _, p := range v.Publishers {
			total["picks"] += p.PicksTotal
		}
		if n, ok := tp.Metric(t, h, `caddy_edgesteer_latency_bucket_store_hits_total{level="redis",policy="apps"}`); !ok || n != float64(s.HitsRedis) {
			t.Fatalf("%s: redis hits metric %v (%v), view %d", h, n, ok, s.HitsRedis)
		}
	}
	// Each pair is written once (by the replica that picked first) and
	// read from Redis once by each of the two others (a racing first pick
	// adopts the winner instead).
	if total["writes"] != 100 || total["redis"]+total["adopted"] != 200 || total["picks"] != 600 {
		t.Fatalf("totals over the replicas: %v; want 100 writes, 200 Redis hits or adoptions, 600 picks", total)
	}
	t.Logf("first burst: %d pairs over %d publishers; totals %v", len(pinned), used, total)

	// A replica restarted with an empty table follows Redis.
	if err := c.replicas["r2"].Stop(); err != nil {
		t.Logf("stopping r2: %v", err)
	}
	c.startReplica("r2")
	for pair, want := range pinned {
		peer, decision, err := c.get("r2", pair[0], pair[1])
		if err != nil || peer != want || decision != "sticky" {
			t.Fatalf("restarted r2, %v: %s %s %v; pinned to %s", pair, peer, decision, err, want)
		}
	}
	if v, _ := c.view("r2"); v.StickyStore.HitsRedis != 100 || v.StickyEntries != 100 {
		t.Fatalf("restarted r2: %d Redis hits, %d entries; want 100 each", v.StickyStore.HitsRedis, v.StickyEntries)
	}

	// Redis killed: nothing fails, known pairs keep their publisher (local
	// hits), new pairs are picked locally.
	c.redis.Kill()
	got := c.burst(append(users[:10:10], names("during", 20)...), apps, 3)
	for pair, peers := range got {
		if want, ok := pinned[pair]; ok {
			for _, p := range peers {
				if p != want {
					t.Fatalf("with Redis down, %v left its publisher %s for %s", pair, want, p)
				}
			}
		}
	}
	for _, h := range replicaHosts {
		v := c.waitView(h, func(v latencybucket.PolicyView) bool { return !v.StickyStore.Healthy }, "Redis down")
		if v.StickyStore.LastError == "" || v.StickyStore.Errors == 0 || v.StickyStore.DownSince.IsZero() {
			t.Fatalf("%s with Redis down: %+v", h, v.StickyStore)
		}
		if v.StickyStore.Skipped == 0 {
			t.Fatalf("%s: every local miss still called the dead Redis: %+v", h, v.StickyStore)
		}
		// The 100 pairs of the first burst, and the 40 new ones, each seen
		// once per replica and pinned locally.
		if v.StickyEntries != 140 {
			t.Fatalf("%s with Redis down: %d local pins, want 140", h, v.StickyEntries)
		}
	}

	// Redis back (empty: no persistence): once each replica's ping
	// answers, new pairs are shared again.
	c.startRedis()
	for _, h := range replicaHosts {
		c.waitView(h, func(v latencybucket.PolicyView) bool { return v.StickyStore.Healthy }, "Redis healthy again")
	}
	_, used = consistent(t, "after Redis came back", c.burst(names("after", 50), apps, 3))
	if used < 2 {
		t.Fatalf("after Redis came back: every pair on one publisher")
	}
	if logs := c.replicas["r1"].Logs(); !strings.Contains(logs, "sticky store unreachable") || !strings.Contains(logs, "sticky store is back") {
		t.Fatalf("r1 did not log Redis going and coming back:\n%s", logs)
	}
}
