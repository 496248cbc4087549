package peerratelimit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// A Redis that accepts connections and never answers (a hung server, a
// stopped process, a black-holed proxy) through bin/caddy: every sync is
// given up at the client's read timeout, the replica enforces the
// fallback share and says so, no request waits or fails, and the shares
// resync when the store answers again.

const hangRate = 50 // the cluster-wide limit of the tests below, per second

// scope is a testing.TB whose cleanups run at end (or when the test
// ends, if end was not called): it closes an e2e.HangingListener in the
// middle of a test, so that Redis can take its address.
type scope struct {
	testing.TB
	mu  sync.Mutex
	fns []func()
}

func newScope(t testing.TB) *scope {
	s := &scope{TB: t}
	t.Cleanup(s.end)
	return s
}

func (s *scope) Cleanup(f func()) {
	s.mu.Lock()
	s.fns = append(s.fns, f)
	s.mu.Unlock()
}

func (s *scope) end() {
	s.mu.Lock()
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// replica is one bin/caddy replica of the tests.
type replica struct {
	c     *e2e.Caddy
	front string
}

func startReplica(t *testing.T, redisAddr string) *replica { return startReplicaWith(t, redisAddr, "") }

// startReplicaWith starts a replica (clusterSiteConfig: profile p at
// hangRate per second cluster-wide) with more options in its cluster
// block.
func startReplicaWith(t *testing.T, redisAddr, clusterOptions string) *replica {
	front := e2e.Addr(t)
	r := &replica{c: e2e.StartCaddy(t, "caddyfile", clusterSiteConfig(redisAddr, front, fmt.Sprint("rate ", hangRate), clusterOptions)), front: front}
	r.c.WaitTCP(t, front)
	return r
}

func (r *replica) view(t *testing.T) *peerratelimit.ClusterView {
	_, v := clusterView(t, r.c, "edge", "p")
	return v
}

func (r *replica) metric(t *testing.T, name string, labels string) float64 {
	v, _ := r.c.Metric(t, `caddy_edgesteer_peer_rate_limit_`+name+`{handler="edge",profile="p"`+labels+`}`)
	return v
}

// waitHung waits until r reports the store down by a timeout: the view
// says fallback with a timeout error, attempts go on (last_attempt moves,
// one sync is never stuck), and cluster_errors_total{reason="timeout"}
// grows by at least 3 while cluster_fallback is 1.
func waitHung(t *testing.T, r *replica) {
	t.Helper()
	timeouts := r.metric(t, "cluster_errors_total", `,reason="timeout"`)
	v := waitCluster(t, r.c, "store reported down", func(v *peerratelimit.ClusterView) bool {
		return v.Fallback && !v.RedisHealthy && timedOut(v.LastError)
	})
	waitCluster(t, r.c, "syncs keep being attempted", func(w *peerratelimit.ClusterView) bool {
		return w.Fallback && w.LastAttempt.After(v.LastAttempt) && w.SyncErrors >= v.SyncErrors+3
	})
	// The metrics follow the view within the same sync.
	deadline := time.Now().Add(30 * time.Second)
	for r.metric(t, "cluster_errors_total", `,reason="timeout"`) < timeouts+3 || r.metric(t, "cluster_fallback", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("store hung: cluster_errors_total{reason=timeout} went from %v to %v over 3 failed syncs; cluster_fallback %v",
				timeouts, r.metric(t, "cluster_errors_total", `,reason="timeout"`), r.metric(t, "cluster_fallback", ""))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// timedOut reports whether a sync's error is a timeout (go-redis reports
// the client's read timeout as the sync's context deadline, or as is).
func timedOut(err string) bool {
	return strings.Contains(err, "deadline exceeded") || strings.Contains(err, "i/o timeout")
}

// waitAnswering waits until r has synced again with replicas live
// replicas and left the fallback (view and metric).
func waitAnswering(t *testing.T, r *replica, replicas int) {
	t.Helper()
	syncs := r.metric(t, "cluster_sync_total", "")
	waitCluster(t, r.c, "resync", func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && !v.Fallback && v.ReplicasSeen == replicas
	})
	deadline := time.Now().Add(30 * time.Second)
	for r.metric(t, "cluster_sync_total", "") < syncs+2 || r.metric(t, "cluster_fallback", "") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the store answered again: cluster_sync_total %v (was %v), cluster_fallback %v",
				r.metric(t, "cluster_sync_total", ""), syncs, r.metric(t, "cluster_fallback", ""))
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(r.c.Logs(), "cluster store answering again") {
		if time.Now().After(deadline) {
			t.Fatal("no log line when the store answered again")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bursts sends peer a's requests to every replica at once for d (4
// concurrent clients each) and returns each replica's outcome. Every
// request must be answered 200 or 429 within the client's 5 s timeout.
func bursts(t *testing.T, rs []*replica, d time.Duration, phase string) []*outcome {
	t.Helper()
	out := make([]*outcome, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = burst(t, "http://"+r.front+"/", "a", d)
		}()
	}
	wg.Wait()
	for i, o := range out {
		t.Logf("%s: replica %d: %d admitted, %d refused in %v", phase, i, o.ok.Load(), o.rejected.Load(), o.elapsed)
		if o.other.Load() != 0 {
			t.Fatalf("%s: replica %d: %d requests failed (5xx or no answer within 5 s), %d admitted, %d refused",
				phase, i, o.other.Load(), o.ok.Load(), o.rejected.Load())
		}
		if o.ok.Load() == 0 || o.rejected.Load() == 0 {
			t.Fatalf("%s: replica %d: %d admitted, %d refused: the offered load must exceed the share", phase, i, o.ok.Load(), o.rejected.Load())
		}
	}
	return out
}

// Redis hangs from the start: the store's address is a listener that
// accepts and never answers. The one replica never synced, so it falls
// back to the whole limit (÷ 1 replica) and enforces it; when a real
// redis-server takes the address, it syncs and the rate is the limit.
func TestClusterStoreHangsFromStart(t *testing.T) {
	e2e.SkipShort(t)
	addr := e2e.Addr(t)
	hang := newScope(t)
	_, conns := e2e.HangingPeer(hang, addr)
	r := startReplica(t, addr)
	waitHung(t, r)
	if conns.Accepted.Load() == 0 {
		t.Fatal("no connection reached the hanging store: the test did not test a hang")
	}

	hung := bursts(t, []*replica{r}, 2*time.Second, "store hung")
	o := hung[0]
	// The fallback share is the limit ÷ 1 (no replica count known yet):
	// at most the limit plus the share's burst, at least 80 % of it.
	if got, hi := o.ok.Load(), most(hangRate, clusterBurst(hangRate), o.elapsed); got > hi || float64(got) < 0.8*hangRate*o.elapsed.Seconds() {
		t.Fatalf("store hung: admitted %d in %v, want %.0f..%d (the limit ÷ 1 replica)", got, o.elapsed, 0.8*hangRate*o.elapsed.Seconds(), hi)
	}
	if n := strings.Count(r.c.Logs(), "cluster store unreachable"); n != 1 {
		t.Fatalf("the fallback was logged %d times, want once", n)
	}

	checkConnections(t, conns, r)
	hang.end()
	e2e.StartRedisAt(t, t.TempDir(), addr)
	waitAnswering(t, r, 1)
	burst(t, "http://"+r.front+"/", "a", 500*time.Millisecond) // a share from real totals
	back := bursts(t, []*replica{r}, 2*time.Second, "store answering again")
	notSlowed(t, hung, back, "answering again")
	o = back[0]
	if got, hi := o.ok.Load(), most(hangRate, clusterBurst(hangRate), o.elapsed); got > hi || float64(got) < 0.8*hangRate*o.elapsed.Seconds() {
		t.Fatalf("store answering again: admitted %d in %v, want %.0f..%d", got, o.elapsed, 0.8*hangRate*o.elapsed.Seconds(), hi)
	}
	if v := r.view(t); len(v.Shares) != 1 || v.Shares[0].Peer != "a" || v.Shares[0].SharePerSecond < 0.9*hangRate {
		t.Fatalf("shares after the resync %+v, want peer a at ~%d/s", v.Shares, hangRate)
	}
}

// Two replicas share a real redis-server, which is swapped mid-run for a
// listener that accepts and never answers, on the same address, and then
// back. While it hangs each replica enforces the limit ÷ 2 (the last
// known count): together at most the limit. When Redis answers again,
// the shares follow demand again: one replica alone gets the whole limit,
// twice its fallback share.
func TestClusterStoreHangsMidRun(t *testing.T) {
	e2e.SkipShort(t)
	dir, addr := t.TempDir(), e2e.Addr(t)
	srv := e2e.StartRedisAt(t, dir, addr)
	rs := []*replica{startReplica(t, addr), startReplica(t, addr)}
	for _, r := range rs {
		waitCluster(t, r.c, "both replicas synced", func(v *peerratelimit.ClusterView) bool { return v.RedisHealthy && v.ReplicasSeen == 2 })
	}

	// Healthy: together the limit. Tolerance: each replica's share burst,
	// and 5 % for shares that follow demand one sync late.
	bursts(t, rs, 500*time.Millisecond, "settle")
	healthy := bursts(t, rs, 2*time.Second, "healthy")
	outs := healthy
	total, hi := sumHigh(outs, 1.05, hangRate/2.0)
	if float64(total) > hi || float64(total) < 0.8*hangRate*outs[0].elapsed.Seconds() {
		t.Fatalf("healthy: the two replicas admitted %d in %v, want %.0f..%.0f", total, outs[0].elapsed, 0.8*hangRate*outs[0].elapsed.Seconds(), hi)
	}

	// Swap: redis-server stops, a hanging listener takes its address.
	srv.Stop()
	hang := newScope(t)
	_, conns := e2e.HangingPeer(hang, addr)
	for _, r := range rs {
		waitHung(t, r)
	}
	if conns.Accepted.Load() == 0 {
		t.Fatal("no connection reached the hanging store: the test did not test a hang")
	}
	outs = bursts(t, rs, 2*time.Second, "store hung")
	notSlowed(t, outs, healthy, "healthy")
	// Each at most the limit ÷ 2 plus its share's burst (no 5 % here:
	// the fallback share is fixed), together at least 80 % of the limit.
	for i, o := range outs {
		if got, hi := o.ok.Load(), most(hangRate/2.0, clusterBurst(hangRate/2.0), o.elapsed); got > hi {
			t.Fatalf("store hung: replica %d admitted %d in %v, want ≤ %d (the limit ÷ 2 last known replicas)", i, got, o.elapsed, hi)
		}
	}
	if total := outs[0].ok.Load() + outs[1].ok.Load(); float64(total) < 0.8*hangRate*outs[0].elapsed.Seconds() {
		t.Fatalf("store hung: the two replicas admitted %d in %v, want ≥ 80 %% of %d/s", total, outs[0].elapsed, hangRate)
	}
	checkConnections(t, conns, rs...)

	// Back: redis-server on the same address (empty: the replicas
	// re-register), shares from demand again.
	hang.end()
	e2e.StartRedisAt(t, dir, addr)
	for _, r := range rs {
		waitAnswering(t, r, 2)
	}
	// Only replica 0 has traffic: within a few syncs its share is the
	// whole limit (in fallback it would stay at half).
	burst(t, "http://"+rs[0].front+"/", "a", time.Second)
	o := bursts(t, rs[:1], 2*time.Second, "store answering again")[0]
	if got, hi := o.ok.Load(), most(hangRate, clusterBurst(hangRate), o.elapsed); got > hi || float64(got) < 0.8*hangRate*o.elapsed.Seconds() {
		t.Fatalf("store answering again, one replica busy: admitted %d in %v, want %.0f..%d", got, o.elapsed, 0.8*hangRate*o.elapsed.Seconds(), hi)
	}
}

// checkConnections fails if connections pile up at the hanging store:
// the fewest open at once over ten looks 50 ms apart must be at most
// three per replica (its one profile): the sync's, given up at its
// deadline and dropped, one go-redis dialed for a sync that gave up
// first (kept idle for the next), and the heartbeat's (README, Faults).
// The fewest, not the most: on a busy host the listener sees a dropped
// connection's close late (the most seen open was 5 for one replica in a
// full make test). Syncs that overlapped, each holding its connection
// until go-redis's read timeout, kept 10 open here. How many were
// accepted is not bounded: each failed sync and heartbeat may drop its
// connection and dial another.
func checkConnections(t *testing.T, conns *e2e.HangCounts, rs ...*replica) {
	t.Helper()
	fewest := conns.Open.Load()
	for range 9 {
		time.Sleep(50 * time.Millisecond)
		fewest = min(fewest, conns.Open.Load())
	}
	var failed uint64
	for _, r := range rs {
		failed += r.view(t).SyncErrors
	}
	accepted, peak := conns.Accepted.Load(), conns.Peak.Load()
	t.Logf("the hanging store accepted %d connections, at most %d open at once, at least %d over 0.5 s; %d syncs failed", accepted, peak, fewest, failed)
	if fewest > int64(3*len(rs)) {
		t.Fatalf("the hanging store held at least %d connections open throughout 0.5 s from %d replicas (%d accepted, %d syncs failed): hung syncs leave their connections open", fewest, len(rs), accepted, failed)
	}
}

// notSlowed fails unless the replicas answered at least a tenth as many
// requests while the store hung as in phase ref of the same run (a
// same-run ratio, not a time): a request path that waited for Redis,
// even for one read_timeout, would answer a few per second per client.
func notSlowed(t *testing.T, hung, ref []*outcome, phase string) {
	t.Helper()
	var h, r int64
	for _, o := range hung {
		h += o.ok.Load() + o.rejected.Load()
	}
	for _, o := range ref {
		r += o.ok.Load() + o.rejected.Load()
	}
	t.Logf("answered while the store hung: %d; %s: %d", h, phase, r)
	if h*10 < r {
		t.Fatalf("answered %d requests while the store hung, %d %s: requests wait for Redis", h, r, phase)
	}
}

// sumHigh returns the outcomes' admitted total and its upper bound: rate
// per replica × slack over the longest elapsed time, plus each replica's
// share burst and one.
func sumHigh(outs []*outcome, slack, rate float64) (int64, float64) {
	var total int64
	var hi float64
	for _, o := range outs {
		total += o.ok.Load()
		hi += rate*slack*o.elapsed.Seconds() + float64(clusterBurst(rate)) + 1
	}
	return total, hi
}

// redis-server stopped with SIGSTOP: the kernel still accepts
// connections, the pooled ones and new ones get no answer. The replica
// falls back, keeps answering at the limit, and resyncs after SIGCONT.
func TestClusterStoreProcessStopped(t *testing.T) {
	e2e.SkipShort(t)
	_, addr := e2e.StartRedis(t)
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid <= 0 {
		t.Fatalf("no process_id in INFO server:\n%s", info)
	}
	r := startReplica(t, addr)
	waitCluster(t, r.c, "first sync", func(v *peerratelimit.ClusterView) bool { return v.RedisHealthy && v.ReplicasSeen == 1 })
	bursts(t, []*replica{r}, 500*time.Millisecond, "healthy")

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := sync.OnceFunc(func() { syscall.Kill(pid, syscall.SIGCONT) })
	t.Cleanup(cont) // before the Proc's SIGTERM (cleanups run last first)
	waitHung(t, r)
	stopped := bursts(t, []*replica{r}, 2*time.Second, "redis-server stopped")
	o := stopped[0]
	if got, hi := o.ok.Load(), most(hangRate, clusterBurst(hangRate), o.elapsed); got > hi || float64(got) < 0.8*hangRate*o.elapsed.Seconds() {
		t.Fatalf("redis-server stopped: admitted %d in %v, want %.0f..%d (the limit ÷ 1 replica)", got, o.elapsed, 0.8*hangRate*o.elapsed.Seconds(), hi)
	}

	cont()
	waitAnswering(t, r, 1)
	continued := bursts(t, []*replica{r}, 2*time.Second, "redis-server continued")
	notSlowed(t, stopped, continued, "continued")
	o = continued[0]
	if got, hi := o.ok.Load(), most(hangRate, clusterBurst(hangRate), o.elapsed); got > hi || float64(got) < 0.8*hangRate*o.elapsed.Seconds() {
		t.Fatalf("redis-server continued: admitted %d in %v, want %.0f..%d", got, o.elapsed, 0.8*hangRate*o.elapsed.Seconds(), hi)
	}
}

// Redis hangs from the start, and the replicas say how many they are
// (replicas 3): each, never synced, enforces the limit ÷ 3, so the three
// together admit the limit, not three times it. Two replicas run here
// (the third is down, as on the day a cluster starts without its store):
// each admits a third of the limit.
func TestClusterExpectedReplicasBeforeFirstSync(t *testing.T) {
	e2e.SkipShort(t)
	addr := e2e.Addr(t)
	hang := newScope(t)
	_, accepted := e2e.HangingListener(hang, addr)
	rs := []*replica{startReplicaWith(t, addr, "replicas 3"), startReplicaWith(t, addr, "replicas 3")}
	for _, r := range rs {
		waitHung(t, r)
	}
	if accepted.Load() == 0 {
		t.Fatal("no connection reached the hanging store: the test did not test a hang")
	}
	share := hangRate / 3.0
	for i, o := range bursts(t, rs, 3*time.Second, "store hung, replicas 3") {
		if got, hi := o.ok.Load(), most(share, clusterBurst(share), o.elapsed); got > hi || float64(got) < 0.8*share*o.elapsed.Seconds() {
			t.Fatalf("replica %d: admitted %d in %v, want %.0f..%d (the limit ÷ 3 replicas)", i, got, o.elapsed, 0.8*share*o.elapsed.Seconds(), hi)
		}
	}
}
