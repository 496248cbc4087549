package peerratelimit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The Diameter side of TestClusterACLRefusesPeerKeys: two bin/caddy
// replicas in Diameter mode log in to Redis as an ACL user that may touch
// only the profile's replicas key, and one pGW (pgw2.example) sends CCR-U
// to both at once, 4 times the cluster-wide limit. By the fallback rule
// its share is R ÷ 2 on each, so together they admit the limit (the
// floor share would admit a tenth of it); each view, read while
// the load runs, names the refused key and noperm, the metrics count
// them, and each log says so once.
func TestClusterDiameterACLRefusesPeerKeys(t *testing.T) {
	e2e.SkipShort(t)
	const R = 100
	const prefix = "edgesteer:peer_rate_limit:layer4/dra/pgw"
	_, redisAddr := e2e.StartRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer admin.Close()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "part", "on", ">pw", "~{"+prefix+"}:replicas", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	pcrf, pcrfCounts := diamServer(t)
	var caddies []*e2e.Caddy
	var fronts []string
	for range 2 {
		front := e2e.Addr(t)
		c := e2e.StartCaddy(t, "caddyfile", diameterClusterCaddyfile(redisAddr+"\n\t\tusername part\n\t\tpassword pw", front, pcrf, R))
		c.WaitTCP(t, front)
		caddies, fronts = append(caddies, c), append(fronts, front)
	}
	view := func(c *e2e.Caddy) *peerratelimit.ClusterView {
		for _, p := range handlerView(adminView(t, c), "dra").Profiles {
			return p.Cluster
		}
		return nil
	}
	for _, c := range caddies {
		deadline := time.Now().Add(30 * time.Second)
		for v := view(c); v == nil || v.ReplicasSeen != 2; v = view(c) {
			if time.Now().After(deadline) {
				t.Fatalf("the replicas never saw each other: %+v", v)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// 2 s at 200 CCR-U/s on each replica, then 4 s measured.
	var progress [2]atomic.Int64 // requests sent to each replica in this send
	send := func(rounds int) (ok, refused int, elapsed time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var pgws []*diamClient
		for _, f := range fronts {
			pgws = append(pgws, dialDiameter(t, f))
		}
		start := time.Now()
		for i, pgw := range pgws {
			progress[i].Store(0)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer pgw.conn.Close()
				hbh := uint32(1000 * (i + 1))
				var sent []uint32
				for range rounds {
					hbh++
					sent = append(sent, hbh)
					progress[i].Add(1)
					pgw.send(t, request(diameter.CmdCreditControl, diameter.AppGx, 2, hbh, fmt.Sprintf("s%d;%d", i, hbh)))
					time.Sleep(5 * time.Millisecond)
				}
				pgw.wait(t, 1+len(sent), 20*time.Second)
				mu.Lock()
				defer mu.Unlock()
				for _, h := range sent {
					switch a := pgw.get(h); a.result {
					case diam.Success:
						ok++
					case 3002:
						refused++
					default:
						t.Errorf("answer %+v", a)
					}
				}
			}()
		}
		wg.Wait()
		return ok, refused, time.Since(start)
	}
	send(400)
	before := count(pcrfCounts, "gx-ccr-u")
	// The views are read midway through the measured load, while both
	// replicas sync pgw2.example's refused key: once a replica's traffic
	// ends its next sync has no peer key to refuse (on a loaded host one
	// client may finish well before the other).
	type result struct {
		ok, refused int
		elapsed     time.Duration
	}
	done := make(chan result, 1)
	go func() {
		ok, refused, elapsed := send(800)
		done <- result{ok, refused, elapsed}
	}()
	var views []*peerratelimit.ClusterView
	var r result
	for finished := false; !finished; {
		select {
		case r = <-done:
			finished = true
		case <-time.After(10 * time.Millisecond):
		}
		if views == nil && progress[0].Load() >= 400 && progress[1].Load() >= 400 {
			views = []*peerratelimit.ClusterView{view(caddies[0]), view(caddies[1])}
		}
	}
	if views == nil {
		t.Fatalf("the load ended before both clients sent half of it")
	}
	ok, refused, elapsed := r.ok, r.refused, r.elapsed
	t.Logf("ACL refusing pgw2.example's keys: %d admitted, %d refused in %v by both replicas at a cluster-wide %d/s: %.3f × the limit",
		ok, refused, elapsed, R, float64(ok)/(R*elapsed.Seconds()))
	if hi := most(R, 2*clusterBurst(R), elapsed); int64(ok) > hi || float64(ok) < 0.9*R*elapsed.Seconds() || refused == 0 {
		t.Errorf("admitted %d, refused %d in %v; want within 0.9 R and %d by the fallback rule", ok, refused, elapsed, hi)
	}
	if got := count(pcrfCounts, "gx-ccr-u") - before; got != int64(ok) {
		t.Errorf("the PCRF received %d CCR-U, %d were admitted", got, ok)
	}
	for i, c := range caddies {
		v := views[i]
		if v == nil || v.RedisHealthy || v.Fallback || v.FallbackPeers != 1 || len(v.StoreTrouble) != 1 ||
			v.StoreTrouble[0].Peer != "pgw2.example" || v.StoreTrouble[0].Reason != "noperm" ||
			!strings.HasPrefix(v.StoreTrouble[0].Key, "{"+prefix+":pgw2.example}:") || v.ErrorsByReason["noperm"] == 0 {
			t.Errorf("replica %d: view %+v, want pgw2.example at the fallback share with its key and noperm named", i, v)
		}
		if n, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_errors_total{handler="dra",profile="pgw",reason="noperm"}`); n == 0 {
			t.Errorf("replica %d: cluster_errors_total{reason=noperm} is 0", i)
		}
		// Once: the refusal holds while the ACL does, through intervals
		// without the peer's traffic and syncs that time out on a
		// loaded host.
		logs := c.Logs()
		if n := strings.Count(logs, "cluster store refused some keys"); n != 1 || !strings.Contains(logs, "{"+prefix+":pgw2.example}:") {
			t.Errorf("replica %d logged the refusal %d times (want once, naming pgw2.example's key)", i, n)
		}
	}
}

// Three bin/caddy replicas log in to Redis as an ACL user that may touch
// only the replicas key: every command on peer pgw1's epoch keys is
// refused (NOPERM). The README's rule: that peer's share is R ÷ replicas
// (the fallback share) on every replica, so the cluster admits R ± 5 %
// with 3R offered; each view lists the key and the reason in
// store_trouble and counts the peer in fallback_peers; the metrics count
// noperm and the fallback peer; the log says "cluster store refused some
// keys" once, naming the key. With the ACL widened, the shares are
// proportional again and the log says so.
func TestClusterACLRefusesPeerKeys(t *testing.T) {
	e2e.SkipShort(t)
	const R = 100.0
	const prefix = "edgesteer:peer_rate_limit:http/edge/p"
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "r1": 1, "r2": 2, "r3": 3, "redis": 5, "upstream": 6})
	ct := &clusterTopology{tp: tp, replicas: []string{"r1", "r2", "r3"}, procs: map[string]*e2e.Proc{}, redisDir: t.TempDir()}
	ct.startRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: clusterRedisAddr, Dialer: tp.Dialer("client", nil)})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "part", "on", ">pw", "~{"+prefix+"}:replicas", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	tp.Start(t, "upstream", "upstream", e2e.Bin(t, "testpeer"), nil, "-listen", clusterUpstream, "-name", "upstream")
	caddyfile := strings.Replace(replicaCaddyfile(R, false), "address "+clusterRedisAddr,
		"address "+clusterRedisAddr+"\n\t\tusername part\n\t\tpassword pw", 1)
	dir := t.TempDir()
	for _, r := range ct.replicas {
		ct.procs[r] = tp.StartCaddy(t, r, caddyfile, dir, nil)
	}
	ct.waitAll(t, "three replicas registered", ct.replicas, func(v *peerratelimit.ClusterView) bool { return v.ReplicasSeen == 3 })

	lc := startLoad(t, ct, 3*R, []string{tp.IP("r1"), tp.IP("r2"), tp.IP("r3")})
	ct.waitAll(t, "pgw1's keys refused on every replica", ct.replicas, func(v *peerratelimit.ClusterView) bool { return v.FallbackPeers == 1 })
	time.Sleep(time.Second)
	lc.setTag("acl")
	time.Sleep(8 * time.Second)
	lc.setTag("after")
	time.Sleep(500 * time.Millisecond)
	got, w := ct.upstreamCounts(t)["acl"], lc.window("acl")
	if float64(w.sent) < 2*R*8 {
		t.Fatalf("the client offered only %d requests in 8 s (want ≥ 2R/s): the machine is too loaded to test the limit", w.sent)
	}
	t.Logf("ACL refusing pgw1's keys: offered %d, upstream counted %d in 8 s: %.3f × the limit", w.sent, got, float64(got)/(8*R))
	if !within(float64(got), 8*R, 0.05) || len(w.failed) > 0 {
		t.Errorf("upstream counted %d in 8 s (failed %d), want %v ± 5 %% by the fallback rule", got, len(w.failed), 8*R)
	}
	for _, r := range ct.replicas {
		v := ct.view(r)
		ok := v.RedisHealthy == false && !v.Fallback && v.FallbackPeers == 1 && len(v.StoreTrouble) == 1 &&
			v.StoreTrouble[0].Peer == "pgw1" && v.StoreTrouble[0].Reason == "noperm" &&
			strings.HasPrefix(v.StoreTrouble[0].Key, "{"+prefix+":pgw1}:") && v.ErrorsByReason["noperm"] > 0
		for _, s := range v.Shares {
			if s.Peer == "pgw1" && (s.StoreTrouble == "" || !within(s.SharePerSecond, R/3, 0.01)) {
				ok = false
			}
		}
		if !ok {
			t.Errorf("%s: view %+v, want pgw1 at the fallback share R÷3 with its key and noperm named", r, v)
		}
		if n, _ := tp.Metric(t, r, `caddy_edgesteer_peer_rate_limit_cluster_fallback_peers{handler="edge",profile="p"}`); n != 1 {
			t.Errorf("%s: cluster_fallback_peers %v, want 1", r, n)
		}
		if n, _ := tp.Metric(t, r, `caddy_edgesteer_peer_rate_limit_cluster_errors_total{handler="edge",profile="p",reason="noperm"}`); n == 0 {
			t.Errorf("%s: cluster_errors_total{reason=noperm} is 0", r)
		}
		// Once, and no recovery of every key while the ACL holds: the
		// trouble ends only when the store takes the keys (not when an
		// interval without pgw1's traffic leaves them out of a sync, nor
		// when a sync timed out on a loaded host: the store answering
		// again then says the keys are still refused).
		const recovered = "cluster store answering again for every key"
		logs := ct.procs[r].Logs()
		if n := strings.Count(logs, "cluster store refused some keys"); n != 1 || !strings.Contains(logs, "{"+prefix+":pgw1}:") ||
			strings.Contains(logs, recovered) {
			t.Errorf("%s logged the refusal %d times, every key answering %d times (want once, naming pgw1's key, and none); unreachable %d times",
				r, n, strings.Count(logs, recovered), strings.Count(logs, "cluster store unreachable"))
		}
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "part", "allkeys").Err(); err != nil {
		t.Fatal(err)
	}
	ct.waitAll(t, "every key answering again", ct.replicas, func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.FallbackPeers == 0 && len(v.StoreTrouble) == 0
	})
	for _, r := range ct.replicas {
		if !strings.Contains(ct.procs[r].Logs(), "cluster store answering again for every key") {
			t.Errorf("%s did not log the recovery", r)
		}
	}
}
