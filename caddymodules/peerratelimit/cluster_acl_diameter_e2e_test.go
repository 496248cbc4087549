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
// earlier code gave it the floor share, a tenth); each view, read while
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
		// Once per episode: a sync that times out on a loaded host ends
		// the episode, and the next refusal is logged anew.
		logs := c.Logs()
		n, timeouts := strings.Count(logs, "cluster store refused some keys"), strings.Count(logs, "cluster store unreachable")
		if n < 1 || n > 1+timeouts || !strings.Contains(logs, "{"+prefix+":pgw2.example}:") {
			t.Errorf("replica %d logged the refusal %d times with %d timeouts between (want once per episode, naming pgw2.example's key)", i, n, timeouts)
		}
	}
}
