package peerratelimit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

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
		logs := ct.procs[r].Logs()
		if n := strings.Count(logs, "cluster store refused some keys"); n != 1 || !strings.Contains(logs, "{"+prefix+":pgw1}:") {
			t.Errorf("%s logged the refusal %d times (want once, naming pgw1's key)", r, n)
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
