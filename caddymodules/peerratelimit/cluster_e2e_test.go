package peerratelimit_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// clusterBurst is a one-replica cluster limit's burst at rate: the
// default burst, but at least 100 ms of the share (quota.shareTolerance).
func clusterBurst(rate float64) int {
	return max(ratelimit.DefaultBurst(rate), 1+int(math.Ceil(rate*0.1)))
}

// clusterView returns profile's cluster view in handler name.
func clusterView(t *testing.T, c *e2e.Caddy, name, profile string) (peerratelimit.ProfileView, *peerratelimit.ClusterView) {
	t.Helper()
	for _, p := range handlerView(adminView(t, c), name).Profiles {
		if p.Name == profile {
			return p, p.Cluster
		}
	}
	return peerratelimit.ProfileView{}, nil
}

// waitCluster polls the view until ok holds (generous: a loaded machine).
func waitCluster(t *testing.T, c *e2e.Caddy, what string, ok func(*peerratelimit.ClusterView) bool) *peerratelimit.ClusterView {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, v := clusterView(t, c, "edge", "p")
		if v != nil && ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: cluster view %+v", what, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clusterSiteConfig is a replica of a cluster: site front's
// peer_rate_limit edge has profile p, keyed by the X-Peer header, with the
// lines of limits, limited cluster-wide through the Redis at redisAddr
// (key_prefix e2e, sync every 100 ms, and the lines of clusterOptions).
func clusterSiteConfig(redisAddr, front, limits, clusterOptions string) string {
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
		key_prefix e2e
	}
}
http://%s {
	peer_rate_limit {
		name edge
		profile p {
			peer {http.request.header.X-Peer}
			%s
			cluster redis main {
				sync 100ms
				%s
			}
		}
	}
	respond ok
}
`, redisAddr, front, limits, clusterOptions)
}

// burstStoreDown sends peer a's burst to url for a second with the one
// replica's Redis down: no request fails, some are admitted, and at most
// the limit of 50/s (the whole of it: one replica).
func burstStoreDown(t *testing.T, url string) {
	t.Helper()
	o := burst(t, url, "a", time.Second)
	if o.other.Load() != 0 || o.ok.Load() == 0 {
		t.Fatalf("with Redis down: %d admitted, %d failed", o.ok.Load(), o.other.Load())
	}
	if got, hi := o.ok.Load(), most(50, clusterBurst(50), o.elapsed); got > hi {
		t.Fatalf("with Redis down admitted %d at %s, want ≤ %d (limit ÷ 1 replica)", got, url, hi)
	}
}

// One replica through bin/caddy with cluster redis: it registers, syncs and
// gets the whole limit; another program's value under the prefix is
// ignored and counted; with Redis stopped it falls back (logged once,
// metric, admin view) and no request fails; with Redis back it resyncs.
func TestClusterOneReplicaStoreDownAndBack(t *testing.T) {
	e2e.SkipShort(t)
	dir, addr := t.TempDir(), e2e.Addr(t)
	srv := e2e.StartRedisAt(t, dir, addr)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", clusterSiteConfig(addr, front, "rate 50", ""))
	v := waitCluster(t, c, "first sync", func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 1 && !v.LastSync.IsZero()
	})
	if v.KeyPrefix != "e2e:peer_rate_limit:http/edge/p" || v.Redis != "main" || v.SyncIntervalMs != 100 || v.LimitPerSecond != 50 {
		t.Fatalf("cluster view %+v", v)
	}

	// One replica: after a sync or two the share is the whole limit.
	o := burst(t, "http://"+front+"/", "a", 2*time.Second)
	if o.other.Load() != 0 {
		t.Fatalf("%d requests failed", o.other.Load())
	}
	if got, hi := o.ok.Load(), most(50, clusterBurst(50), o.elapsed); got > hi || got < 50 {
		t.Fatalf("admitted %d in %v at a cluster limit of 50/s with one replica, want 50..%d", got, o.elapsed, hi)
	}
	pv, v := clusterView(t, c, "edge", "p")
	if pv.AdmittedTotal != uint64(o.ok.Load()) || pv.RejectedTotal != uint64(o.rejected.Load()) {
		t.Fatalf("view admitted_total %d rejected_total %d, client saw %d and %d", pv.AdmittedTotal, pv.RejectedTotal, o.ok.Load(), o.rejected.Load())
	}
	if len(v.Shares) != 1 || v.Shares[0].Peer != "a" || v.Shares[0].SharePerSecond < 45 {
		t.Fatalf("shares %+v, want peer a at ~50/s", v.Shares)
	}

	// Another program's value where the replicas set lives: ignored,
	// counted, the store still healthy.
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	ctx := context.Background()
	rk := quota.ReplicasKey(v.KeyPrefix)
	rc.Del(ctx, rk)
	rc.Set(ctx, rk, "not a sorted set", 0)
	waitCluster(t, c, "malformed counted", func(v *peerratelimit.ClusterView) bool { return v.Malformed > 0 && v.RedisHealthy })
	if m, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_malformed_total{handler="edge",profile="p"}`); m == 0 {
		t.Fatal("cluster_malformed_total is 0 after a malformed value")
	}
	rc.Del(ctx, rk)

	// Redis stopped: fallback, said once in the log, no failed request.
	logged := len(c.Logs())
	srv.Stop()
	waitCluster(t, c, "fallback", func(v *peerratelimit.ClusterView) bool { return v.Fallback && !v.RedisHealthy && v.LastError != "" })
	burstStoreDown(t, "http://"+front+"/")
	if f, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_fallback{handler="edge",profile="p"}`); f != 1 {
		t.Fatalf("cluster_fallback = %v with Redis down", f)
	}
	// Refused connections are retried by go-redis until the sync's
	// deadline: the reason is refused (or reset) or timeout.
	conn, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_errors_total{handler="edge",profile="p",reason="refused"}`)
	reset, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_errors_total{handler="edge",profile="p",reason="reset"}`)
	conn += reset
	tmo, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_errors_total{handler="edge",profile="p",reason="timeout"}`)
	if conn+tmo < 2 {
		t.Fatalf("cluster_errors_total{reason=refused|reset|timeout} = %v + %v after a second of Redis down", conn, tmo)
	}
	if n := strings.Count(c.Logs()[logged:], "cluster store unreachable"); n != 1 {
		t.Fatalf("the fallback was logged %d times while Redis was down, want once per transition", n)
	}

	// Back: resync, logged once.
	e2e.StartRedisAt(t, dir, addr)
	waitCluster(t, c, "resync", func(v *peerratelimit.ClusterView) bool { return v.RedisHealthy && !v.Fallback && v.ReplicasSeen == 1 })
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.Logs(), "cluster store answering again") {
		if time.Now().After(deadline) {
			t.Fatal("no log line when Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clusterReloadConfig: an HTTP handler and a layer4 handler, each with a
// cluster-wide profile that tracks at most one peer (max_peers 1: a
// second peer's requests are counted in overflowed_total, a count of the
// quota's own); httpCluster is the HTTP profile's cluster line (or
// block), body what the site answers.
func clusterReloadConfig(redisAddr, front, l4, upstream, httpCluster, body string) string {
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
	layer4 {
		%s {
			route {
				peer_rate_limit {
					name conns
					profile p {
						rate 100
						max_peers 1
						cluster redis main
					}
				}
				proxy %s
			}
		}
	}
}
http://%s {
	peer_rate_limit {
		name edge
		profile p {
			peer {http.request.header.X-Peer}
			rate 50
			max_peers 1
			%s
		}
	}
	respond %s
}
`, redisAddr, l4, upstream, front, httpCluster, body)
}

// l4Connect opens one connection to front from the loopback address src,
// sends a request line and reads the answer to its end.
func l4Connect(t *testing.T, src, front string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", front)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	io.ReadAll(conn)
}

// sendUntilStopped sends peer's requests to url at rate per second until stopped.
func sendUntilStopped(t *testing.T, url, peer string, rate float64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		client := &http.Client{Timeout: 5 * time.Second}
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", url, nil)
			req.Header.Set("X-Peer", peer)
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// Reloads keep a profile's quota — its shares, its counts, its replica
// identity and its sync — when its cluster settings are unchanged (HTTP
// and layer4 alike), start a new one when they change (a changed sync
// interval: applied, the counts from zero), and stop the sync of a
// profile whose cluster block is removed (its metric series go).
//
// What a new quota would lose is made visible before the reload: peer a
// sends at twice the limit throughout, so its share is the whole limit
// (one replica), and with max_peers 1 a second peer's requests are
// counted in overflowed_total — in both handlers. A new quota starts
// with a at the floor share (5/s) until one or two syncs (1 s apart)
// have passed, and with no overflow counted.
func TestClusterReload(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	front, l4 := e2e.Addr(t), e2e.Addr(t)
	up := e2e.Addr(t)
	e2e.StartPeer(t, "up", up, 0)
	const slowSync = "cluster redis main {\nsync 1s\n}"
	c := e2e.StartCaddy(t, "caddyfile", clusterReloadConfig(redisAddr, front, l4, up, slowSync, "ok"))
	l4view := func() *peerratelimit.ClusterView {
		p := handlerView(adminView(t, c), "conns").Profiles
		if len(p) == 0 {
			return nil
		}
		return p[0].Cluster
	}
	deadline := time.Now().Add(30 * time.Second)
	for v := l4view(); v == nil || !v.RedisHealthy; v = l4view() {
		if time.Now().After(deadline) {
			t.Fatalf("layer4 cluster never synced: %+v", v)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitCluster(t, c, "http first sync", func(v *peerratelimit.ClusterView) bool { return v.RedisHealthy })

	// Layer4: 127.0.0.1 is the tracked peer, 127.0.0.2's connections
	// overflow.
	for range 3 {
		l4Connect(t, "127.0.0.1", l4)
	}
	for range 3 {
		l4Connect(t, "127.0.0.2", l4)
	}
	beforeL4 := l4view()
	if beforeL4 == nil || beforeL4.OverflowedTotal == 0 {
		t.Fatalf("layer4: no overflow counted after a second peer's connections: %+v", beforeL4)
	}

	// HTTP: a sends at 2× the limit from now to the last reload; b's
	// requests overflow once a is tracked.
	stopA := sendUntilStopped(t, "http://"+front+"/", "a", 100)
	waitCluster(t, c, "peer a tracked", func(v *peerratelimit.ClusterView) bool {
		return len(v.Shares) == 1 && v.Shares[0].Peer == "a"
	})
	if o := burstWith(t, "http://"+front+"/", 200*time.Millisecond, 1, func() string { return "b" }); o.ok.Load()+o.rejected.Load() == 0 {
		t.Fatal("peer b got no answer")
	}
	before := waitCluster(t, c, "a's share the whole limit", func(v *peerratelimit.ClusterView) bool {
		return len(v.Shares) == 1 && v.Shares[0].Peer == "a" && v.Shares[0].SharePerSecond >= 45 && v.OverflowedTotal > 0
	})

	// A reload that leaves both cluster settings as they are (the site's
	// answer changes): the same quotas, read at once after it.
	c.Load(t, "caddyfile", clusterReloadConfig(redisAddr, front, l4, up, slowSync, "ok2"))
	_, after := clusterView(t, c, "edge", "p")
	afterL4 := l4view()
	if after == nil || afterL4 == nil {
		t.Fatalf("cluster views after the reload: http %+v, layer4 %+v", after, afterL4)
	}
	if after.OverflowedTotal != before.OverflowedTotal || after.PeersTracked != 1 || len(after.Shares) != 1 ||
		after.Shares[0].Peer != "a" || after.Shares[0].SharePerSecond < 45 || after.Replica != before.Replica ||
		after.LastSync.Before(before.LastSync) {
		t.Errorf("http quota across a reload that keeps its settings: before overflowed %d, peers %d, shares %+v, last sync %v; after overflowed %d, peers %d, shares %+v, last sync %v (a new quota: a at the floor, no overflow)",
			before.OverflowedTotal, before.PeersTracked, before.Shares, before.LastSync, after.OverflowedTotal, after.PeersTracked, after.Shares, after.LastSync)
	}
	if afterL4.OverflowedTotal != beforeL4.OverflowedTotal || afterL4.Replica != beforeL4.Replica || afterL4.LastSync.Before(beforeL4.LastSync) {
		t.Errorf("layer4 quota across a reload that keeps its settings: before overflowed %d, last sync %v; after overflowed %d, last sync %v",
			beforeL4.OverflowedTotal, beforeL4.LastSync, afterL4.OverflowedTotal, afterL4.LastSync)
	}
	resp, err := http.Get("http://" + front + "/") // no X-Peer: keyed by address, a peer of its own
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 200 && string(body) != "ok2" {
		t.Fatalf("after the reload the site answers %q, want ok2 (the reload did not apply)", body)
	}

	// A changed sync interval: applied, on a new quota (its counts from 0).
	c.Reload(t, "caddyfile", clusterReloadConfig(redisAddr, front, l4, up, "cluster redis main {\nsync 200ms\n}", "ok2"))
	v := waitCluster(t, c, "changed sync applied", func(v *peerratelimit.ClusterView) bool {
		return v.SyncIntervalMs == 200 && v.RedisHealthy && v.LastSync.After(time.Now().Add(-2*time.Second))
	})
	if v.OverflowedTotal != 0 || v.Replica != before.Replica {
		t.Errorf("after a changed sync: overflowed %d (want 0: a new quota), replica %s (was %s)", v.OverflowedTotal, v.Replica, before.Replica)
	}
	waitCluster(t, c, "a's share again", func(v *peerratelimit.ClusterView) bool {
		return len(v.Shares) == 1 && v.Shares[0].Peer == "a" && v.Shares[0].SharePerSecond >= 45
	})
	stopA()
	var later *peerratelimit.ClusterView
	for deadline := time.Now().Add(30 * time.Second); ; {
		later = l4view()
		if later != nil && later.LastSync.After(beforeL4.LastSync.Add(time.Second)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("layer4 cluster stopped syncing across the reloads: before %+v, after %+v", beforeL4, later)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if later.Replica != beforeL4.Replica || !later.RedisHealthy || later.SyncErrors != 0 || later.OverflowedTotal != beforeL4.OverflowedTotal {
		t.Fatalf("layer4 cluster across two reloads: before %+v, after %+v", beforeL4, later)
	}

	c.Reload(t, "caddyfile", clusterReloadConfig(redisAddr, front, l4, up, "", "ok2"))
	if _, v := clusterView(t, c, "edge", "p"); v != nil {
		t.Fatalf("cluster view after removing cluster: %+v", v)
	}
	if _, ok := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_sync_total{handler="edge",profile="p"}`); ok {
		t.Fatal("cluster_sync_total of edge/p still exported after its cluster block was removed")
	}
	if _, ok := c.Metric(t, `caddy_edgesteer_peer_rate_limit_cluster_sync_total{handler="conns",profile="p"}`); !ok {
		t.Fatal("cluster_sync_total of the layer4 handler is gone")
	}
	// The HTTP profile is limited per replica again: 50/s here.
	o := burst(t, "http://"+front+"/", "a", time.Second)
	if hi := most(50, 4, o.elapsed); o.ok.Load() > hi || o.ok.Load() < 40 || o.other.Load() != 0 {
		t.Fatalf("after removing cluster: admitted %d (want 40..%d), failed %d", o.ok.Load(), hi, o.other.Load())
	}
}

// diameterClusterCaddyfile is a Diameter-mode replica at front: profile
// pgw limits each peer to rate per second cluster-wide through store main
// (store: the lines of its edgesteer_redis block), proxied to pcrf.
func diameterClusterCaddyfile(store, front, pcrf string, rate int) string {
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
	layer4 {
		%s {
			route {
				peer_rate_limit {
					name dra
					diameter {
						origin_host dra.example
						origin_realm example
					}
					profile pgw {
						rate %d
						cluster redis main {
							sync 100ms
						}
					}
				}
				proxy %s
			}
		}
	}
}
`, store, front, rate, pcrf)
}

// Diameter mode with a cluster-wide overall limit, through bin/caddy: the
// peer is the CER's Origin-Host, requests past the replica's share (here
// the whole limit: one replica) get 3002, and the admin view shows the
// share of pgw2.example.
func TestClusterDiameter(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	pcrf, pcrfCounts := diamServer(t)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", diameterClusterCaddyfile(redisAddr, front, pcrf, 100))
	c.WaitTCP(t, front)
	pgw := dialDiameter(t, front)
	// 300 rounds 5 ms apart of 2 CCR-U: ~400/s against 100/s.
	start, hbh := time.Now(), uint32(100)
	var sent []uint32
	for range 300 {
		var batch []byte
		for range 2 {
			hbh++
			sent = append(sent, hbh)
			batch = append(batch, request(diameter.CmdCreditControl, diameter.AppGx, 2, hbh, fmt.Sprintf("s;%d", hbh))...)
		}
		pgw.send(t, batch)
		time.Sleep(5 * time.Millisecond)
	}
	pgw.wait(t, 1+len(sent), 20*time.Second)
	elapsed := time.Since(start)
	ok, refused := 0, 0
	for _, h := range sent {
		switch a := pgw.get(h); a.result {
		case diam.Success:
			ok++
		case 3002:
			refused++
		default:
			t.Fatalf("answer %+v", a)
		}
	}
	// The first requests come before the first sync with the floor share
	// (10/s): the admitted count is between that and the limit.
	if hi := most(100, clusterBurst(100), elapsed); ok > int(hi) || ok < int(0.5*100*elapsed.Seconds()) || refused == 0 {
		t.Fatalf("admitted %d, refused %d in %v at a cluster-wide 100/s (want ≤ %d)", ok, refused, elapsed, hi)
	}
	if got := count(pcrfCounts, "gx-ccr-u"); got != int64(ok) {
		t.Fatalf("the PCRF received %d CCR-U, %d were admitted", got, ok)
	}
	var v *peerratelimit.ClusterView
	for _, p := range handlerView(adminView(t, c), "dra").Profiles {
		v = p.Cluster
	}
	if v == nil || !v.RedisHealthy || len(v.Shares) != 1 || v.Shares[0].Peer != "pgw2.example" || v.KeyPrefix != "edgesteer:peer_rate_limit:layer4/dra/pgw" {
		t.Fatalf("cluster view %+v", v)
	}
}

// Dynamic throttling lowers the cluster-wide limit: the load file says 60 %,
// the table throttles 50 %, the quota's effective limit halves, and the
// admitted rate follows.
func TestClusterDynamicThrottle(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	load := filepath.Join(t.TempDir(), "load")
	if err := os.WriteFile(load, []byte("10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
}
http://%s {
	peer_rate_limit {
		name edge
		profile p {
			peer {http.request.header.X-Peer}
			rate 100
			dynamic
			cluster redis main
		}
		dynamic {
			source file %s
			interval 200ms
			threshold 50 50
		}
	}
	respond ok
}
`, redisAddr, front, load))
	waitCluster(t, c, "first sync", func(v *peerratelimit.ClusterView) bool { return v.RedisHealthy && v.ThrottlePercent == 0 })
	if err := os.WriteFile(load, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitCluster(t, c, "throttled", func(v *peerratelimit.ClusterView) bool {
		return v.ThrottlePercent == 50 && v.EffectivePerSecond == 50
	})
	burst(t, "http://"+front+"/", "a", 500*time.Millisecond) // the share settles
	o := burst(t, "http://"+front+"/", "a", 2*time.Second)
	if hi := most(50, clusterBurst(50), o.elapsed); o.ok.Load() > hi || o.ok.Load() < 50 || o.other.Load() != 0 {
		t.Fatalf("throttled to 50/s: admitted %d in %v (want 50..%d), failed %d", o.ok.Load(), o.elapsed, hi, o.other.Load())
	}
}

// The example rate-limit-cluster.Caddyfile through bin/caddy: pgw* peers
// are limited cluster-wide (healthy sync, a share for pgw1), other peers
// per replica; the layer4 profile syncs too.
func TestClusterExample(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	front, l4, up := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	e2e.StartPeer(t, "up", up, 0)
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "rate-limit-cluster.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer("127.0.0.1:6379", redisAddr, "127.0.0.1:8082", front,
		"127.0.0.1:3870", l4, "127.0.0.1:3868", up).Replace(string(data))
	c := e2e.StartCaddy(t, "caddyfile", cfg)
	o := burst(t, "http://"+front+"/", "pgw1", time.Second)
	if o.ok.Load() == 0 || o.ok.Load() > most(1000, clusterBurst(1000), o.elapsed) || o.other.Load() != 0 {
		t.Fatalf("pgw1: admitted %d, failed %d", o.ok.Load(), o.other.Load())
	}
	o = burst(t, "http://"+front+"/", "other1", time.Second)
	if hi := most(50, 4, o.elapsed); o.ok.Load() == 0 || o.ok.Load() > hi || o.rejected.Load() == 0 {
		t.Fatalf("other1 at 50/s per replica: admitted %d (want ≤ %d), refused %d", o.ok.Load(), hi, o.rejected.Load())
	}
	views := adminView(t, c)
	for _, name := range []string{"edge", "edge-l4"} {
		h := handlerView(views, name)
		if len(h.Profiles) == 0 || h.Profiles[0].Cluster == nil || !h.Profiles[0].Cluster.RedisHealthy {
			t.Fatalf("handler %s: %+v", name, h)
		}
	}
	if h := handlerView(views, "edge"); len(h.Profiles) != 2 || h.Profiles[1].Cluster != nil {
		t.Fatalf("profile other has a cluster view: %+v", h)
	}
	if sh := handlerView(views, "edge").Profiles[0].Cluster.Shares; len(sh) == 0 || sh[0].Peer != "pgw1" {
		t.Fatalf("shares of pgw: %+v", sh)
	}
}

// A message type's cluster-wide limit through bin/caddy with one replica:
// its quota syncs with the profile's (the view lists it, key prefix
// <profile prefix>/message/<type>), gets the whole limit, falls back with
// Redis stopped (the type's view says so, no request fails, at most the
// limit) and resyncs when Redis is back.
func TestClusterMessageTypeStoreDownAndBack(t *testing.T) {
	e2e.SkipShort(t)
	dir, addr := t.TempDir(), e2e.Addr(t)
	srv := e2e.StartRedisAt(t, dir, addr)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", clusterSiteConfig(addr, front, `rate 100000
			message m {
				match {
					path /m
				}
				rate 50
			}`, ""))
	msgView := func(v *peerratelimit.ClusterView) *peerratelimit.ClusterMessageView {
		if v == nil || len(v.Messages) != 1 {
			return nil
		}
		return &v.Messages[0]
	}
	v := waitCluster(t, c, "first sync", func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 1 && msgView(v) != nil
	})
	if m := msgView(v); m.Type != "m" || m.KeyPrefix != "e2e:peer_rate_limit:http/edge/p/message/m" || m.LimitPerSecond != 50 {
		t.Fatalf("message view %+v", m)
	}
	o := burst(t, "http://"+front+"/m", "a", 2*time.Second)
	if o.other.Load() != 0 {
		t.Fatalf("%d requests failed", o.other.Load())
	}
	if got, hi := o.ok.Load(), most(50, clusterBurst(50), o.elapsed); got > hi || got < 50 || o.rejected.Load() == 0 {
		t.Fatalf("type m: admitted %d (refused %d) in %v at a cluster limit of 50/s with one replica, want 50..%d and some refused", got, o.rejected.Load(), o.elapsed, hi)
	}
	waitCluster(t, c, "the type's share", func(v *peerratelimit.ClusterView) bool {
		m := msgView(v)
		return m != nil && len(m.Shares) == 1 && m.Shares[0].Peer == "a"
	})
	// Other requests are not the type's: the overall limit only.
	if o := burst(t, "http://"+front+"/other", "a", 500*time.Millisecond); o.rejected.Load() != 0 || o.other.Load() != 0 {
		t.Fatalf("other requests: %d refused, %d failed", o.rejected.Load(), o.other.Load())
	}

	srv.Stop()
	waitCluster(t, c, "fallback", func(v *peerratelimit.ClusterView) bool {
		m := msgView(v)
		return v.Fallback && m != nil && m.Fallback
	})
	burstStoreDown(t, "http://"+front+"/m")

	e2e.StartRedisAt(t, dir, addr)
	waitCluster(t, c, "resync", func(v *peerratelimit.ClusterView) bool {
		m := msgView(v)
		return v.RedisHealthy && !v.Fallback && m != nil && !m.Fallback
	})
}
