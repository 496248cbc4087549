package peerratelimit_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// oneSidedFaults are the faults of TestClusterOneReplicaCutOff: each
// on one replica's link alone (the faulty one, by index), applied by on
// and ended by off. below: the faulty replica's demand is below its
// fallback share, so the cluster admits less than R and the others what
// the rule leaves them, R − R ÷ 3.
type oneSidedFault struct {
	name   string
	faulty int
	on     func()
	off    func()
	below  bool
}

// One replica cut off from Redis while the others are not, through
// three bin/caddy replicas with the default replica_ttl (1 s), each
// logged in as its own ACL user through a relay of its own
// (e2e.FaultyLink), 3R offered 60/30/10 over them: the README's rule
// (Cluster, one replica cut off) holds the cluster at R. In turn: the
// busy replica denied its peer keys by an ACL change; the second one's
// link delayed past the sync deadline (216 ms each way: every sync times
// out, and a new connection's HELLO alone outlasts the next one's
// deadline, so only the heartbeat written alone on a connection of
// replica_ttl deadlines keeps it live to the others); the busy one's link
// reset at every sync's pipeline (every other one after it reached
// Redis); and the quiet one's link delayed, its demand (0.3 R) below its
// fallback share: the others must still admit R − R ÷ 3 between them.
// Once the others count the faulty one at its fallback share (their
// views' replicas_reserved), every 2 s window admits R ± 5 % (counted at
// the upstream, 0.5 s slices; for the quiet one, the others' admissions
// at least 0.95 × (R − R ÷ 3) and the total at most 1.05 R), over the
// time its slices took, but for windows a host stall of the client
// touched (measureWindows).
func TestClusterOneReplicaCutOff(t *testing.T) {
	e2e.SkipShort(t)
	const R = 100.0
	ttl := os.Getenv("ONESIDE_TTL") // e.g. 30s, for BENCHMARKS.md; default: replica_ttl's
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "r1": 1, "r2": 2, "r3": 3, "redis": 5, "upstream": 6})
	ct := &clusterTopology{tp: tp, replicas: []string{"r1", "r2", "r3"}, procs: map[string]*e2e.Proc{}, redisDir: t.TempDir()}
	ct.startRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: clusterRedisAddr, Dialer: tp.Dialer("client", nil)})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	tp.Start(t, "upstream", "upstream", e2e.Bin(t, "testpeer"), nil, "-listen", clusterUpstream, "-name", "upstream")
	links := make([]*e2e.FaultyLink, len(ct.replicas))
	dir := t.TempDir()
	for i, r := range ct.replicas {
		user := "u" + r
		if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "allkeys", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		if err := tp.In("redis", func() (err error) {
			ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", tp.IP("redis"), 6381+i))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		links[i] = e2e.StartFaultyLink(t, ln, clusterRedisAddr, tp.Dialer("redis", nil))
		caddyfile := strings.Replace(replicaCaddyfile(R, false), "address "+clusterRedisAddr,
			"address "+links[i].Addr()+"\n\t\tusername "+user+"\n\t\tpassword pw", 1)
		if ttl != "" {
			caddyfile = strings.Replace(caddyfile, "cluster redis main", "cluster redis main {\n\t\t\t\treplica_ttl "+ttl+"\n\t\t\t}", 1)
		}
		ct.procs[r] = tp.StartCaddy(t, r, caddyfile, dir, nil)
	}
	ct.waitAll(t, "three replicas registered", ct.replicas, func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 3
	})
	ips := []string{tp.IP("r1"), tp.IP("r2"), tp.IP("r3")}
	lc := startLoad(t, ct, 3*R, weighted(ips, []int{6, 3, 1}))
	time.Sleep(3 * time.Second) // shares settle from the floor to proportional

	acl := func(user string, keys ...string) func() {
		return func() {
			args := append([]any{"ACL", "SETUSER", user, "resetkeys"}, anys(keys)...)
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	const prefix = "edgesteer:peer_rate_limit:http/edge/p"
	faults := []oneSidedFault{
		{"ACL refusing the busy replica's peer keys", 0, acl("ur1", "~{"+prefix+"}:replicas"), acl("ur1", "~*"), false},
		{"the second replica's link delayed past the sync deadline", 1, func() { links[1].Delay(216 * time.Millisecond) }, links[1].Pass, false},
		{"the busy replica's link reset at every sync", 0, func() { links[0].ResetOn("ZADD") }, links[0].Pass, false},
		{"the quiet replica's link delayed, its demand below its fallback share", 2, func() { links[2].Delay(216 * time.Millisecond) }, links[2].Pass, true},
	}
	for _, f := range faults {
		faulty := ct.replicas[f.faulty]
		var others []string
		for _, r := range ct.replicas {
			if r != faulty {
				others = append(others, r)
			}
		}
		f.on()
		ct.waitAll(t, f.name+": "+faulty+" at the fallback share", []string{faulty}, func(v *peerratelimit.ClusterView) bool {
			return v.Reserving && !v.RedisHealthy
		})
		ct.waitAll(t, f.name+": the others count "+faulty+" at its fallback share", others, func(v *peerratelimit.ClusterView) bool {
			return v.ReplicasReserved == 1 && v.ReplicasSeen == 3
		})
		// The fault is one-sided only while the others sync on time: a
		// measure during which one of them failed a sync, or was counted
		// by the other as having missed one (replicas_reserved above 1: the
		// loaded host stalled the store or them past the deadline, the
		// store-down and paused-replica rules), or with every window
		// touched by a stall of the client (measureWindows), is taken
		// again, up to 3 times.
		var m windows
		for attempt := 1; ; attempt++ {
			before, stallsBefore := ct.syncErrors(others), lc.stalls.Load()
			stalled := ct.watchReserved(others, 1)
			m = measureWindows(t, ct, lc, fmt.Sprintf("%s%d%d", strings.Fields(f.name)[1], f.faulty, attempt), R, ips, f.faulty)
			t.Logf("%s (%s): 2 s windows admitted %s × R (the others %s); client stalls %d; slices %s", f.name, faulty, m.all, m.othersAll, lc.stalls.Load()-stallsBefore, m.slices)
			if ct.syncErrors(others) == before && !stalled() && m.n > 0 {
				break
			}
			if attempt == 3 {
				t.Fatalf("%s: the other replicas failed or missed syncs, or the client stalled in every window, in each of 3 measures: the host is too loaded to test a one-sided fault", f.name)
			}
			t.Logf("%s: the other replicas failed or missed syncs, or the client stalled in every window, meanwhile (a stalled host, not this fault): measured again", f.name)
		}
		f.off()
		switch {
		case f.below && (m.othersLo < 0.95*2/3 || m.hi > 1.05):
			t.Errorf("%s: 2 s windows admitted %.3f–%.3f × R, the others at least %.3f × R; want the others ≥ 0.95 × 2/3, the total ≤ 1.05",
				f.name, m.lo, m.hi, m.othersLo)
		case !f.below && (m.lo < 0.95 || m.hi > 1.05):
			t.Errorf("%s: 2 s windows admitted %.3f–%.3f × R, want 1 ± 0.05", f.name, m.lo, m.hi)
		}
		ct.waitAll(t, f.name+": over", ct.replicas, func(v *peerratelimit.ClusterView) bool {
			return v.RedisHealthy && !v.Reserving && v.ReplicasReserved == 0 && v.ReplicasSeen == 3
		})
		time.Sleep(500 * time.Millisecond)
	}
}

// windows are measureWindows' 2 s windows, × R: the least and most of
// the cluster's (at the upstream) and the least of the others' (answers
// 200 from all but the faulty replica), and each, printed.
type windows struct {
	n                int // windows measured (not touched by a client stall)
	lo, hi, othersLo float64
	all, othersAll   string
	slices           string // per 0.5 s slice: at the upstream (admitted by replica at the client)
}

// measureWindows counts admissions at the upstream over 4 s in 0.5 s
// slices tagged tag-i, and each replica's (ips) at the client, the
// others' (all but ips[faulty]) added up.
func measureWindows(t *testing.T, ct *clusterTopology, lc *loadClient, tag string, R float64, ips []string, faulty int) windows {
	t.Helper()
	const slices = 8
	// at[i]: when slice i began (its tag set). A window's rate is over the
	// time its slices took: on a loaded host a sleep of 500 ms may last
	// longer, and a window then holds more than 2 s of admissions.
	at := make([]time.Time, slices+1)
	for i := range slices {
		lc.setTag(fmt.Sprintf("%s-%d", tag, i))
		at[i] = time.Now()
		time.Sleep(500 * time.Millisecond)
	}
	lc.setTag("after-" + tag)
	at[slices] = time.Now()
	time.Sleep(500 * time.Millisecond) // answers in flight arrive
	counts := ct.upstreamCounts(t)
	sent, failed := 0, 0
	others := make([]int, slices)
	var per []string
	for i := range slices {
		w := lc.window(fmt.Sprintf("%s-%d", tag, i))
		sent, failed = sent+w.sent, failed+len(w.failed)
		for k, ip := range ips {
			if k != faulty {
				others[i] += w.okBy[ip]
			}
		}
		mark := ""
		if lc.stalledIn(fmt.Sprintf("%s-%d", tag, i)) {
			mark = "*"
		}
		per = append(per, fmt.Sprintf("%s%d (%d/%d/%d) in %v", mark, counts[fmt.Sprintf("%s-%d", tag, i)], w.okBy[ips[0]], w.okBy[ips[1]], w.okBy[ips[2]],
			at[i+1].Sub(at[i]).Round(time.Millisecond)))
	}
	if float64(sent) < 2.5*R*slices/2 || failed > 0 {
		t.Fatalf("%s: the client offered %d requests in %d s (want ≥ 2.5R/s), %d failed", tag, sent, slices/2, failed)
	}
	// A host stall of the client (its pacer late over stallGap) bunches
	// its arrivals: the buckets lose the capacity of the pause and the
	// shares follow the bunched demand, and the replicas, stalled with the
	// host, decide the backlog after it. Seen at load 20: slices of 50, 52,
	// *32, 47, 61, 48 admitted (* the stall), windows 0.894 R then 1.059 R,
	// as the 0.88 R and 1.07 R this test measured before. So a window
	// holding a stall or either of the two slices after it (1 s, as the
	// chaos test's stallTail) is not measured.
	touched := make([]bool, slices+2)
	for i := range slices {
		if lc.stalledIn(fmt.Sprintf("%s-%d", tag, i)) {
			touched[i], touched[i+1], touched[i+2] = true, true, true
		}
	}
	m := windows{lo: 1e9, othersLo: 1e9}
	var got, gotOthers []string
	for i := 0; i+4 <= slices; i++ {
		n, o, stalled := 0, 0, false
		for j := i; j < i+4; j++ {
			n += counts[fmt.Sprintf("%s-%d", tag, j)]
			o += others[j]
			stalled = stalled || touched[j]
		}
		if stalled {
			got, gotOthers = append(got, "(stall)"), append(gotOthers, "(stall)")
			continue
		}
		m.n++
		d := at[i+4].Sub(at[i]).Seconds()
		r, ro := float64(n)/(d*R), float64(o)/(d*R)
		m.lo, m.hi, m.othersLo = min(m.lo, r), max(m.hi, r), min(m.othersLo, ro)
		got, gotOthers = append(got, fmt.Sprintf("%.3f", r)), append(gotOthers, fmt.Sprintf("%.3f", ro))
	}
	m.all, m.othersAll, m.slices = strings.Join(got, ", "), strings.Join(gotOthers, ", "), strings.Join(per, " ")
	return m
}

// watchReserved reads hosts' views every 50 ms until the returned func
// is called; it reports whether any view counted more than want replicas
// at their fallback share meanwhile.
func (ct *clusterTopology) watchReserved(hosts []string, want int) func() bool {
	stop, done := make(chan struct{}), make(chan bool)
	go func() {
		more := false
		for {
			for _, h := range hosts {
				if v := ct.view(h); v != nil && v.ReplicasReserved > want {
					more = true
				}
			}
			select {
			case <-stop:
				done <- more
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() bool { close(stop); return <-done }
}

// syncErrors adds up the failed syncs of hosts' views.
func (ct *clusterTopology) syncErrors(hosts []string) (n uint64) {
	for _, h := range hosts {
		if v := ct.view(h); v != nil {
			n += v.SyncErrors
		}
	}
	return n
}

func anys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Three bin/caddy replicas share peer a's limit; one of them is paused
// (SIGSTOP) for 600 ms, longer than two syncs, while all three take a's
// requests: the requests sent to it wait and are decided when it
// resumes; no request fails, and over the window the three admit no
// more than the limit plus their shares' bursts and at least 0.9 of it.
// (The returning replica's share rule is measured finely on the engine,
// TestPausedReplica: a window this coarse cannot tell 1.05 R from 1.15 R.)
func TestClusterPausedReplica(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	rs := []*replica{startReplica(t, redisAddr), startReplica(t, redisAddr), startReplica(t, redisAddr)}
	for _, r := range rs {
		waitCluster(t, r.c, "three replicas registered", func(v *peerratelimit.ClusterView) bool {
			return v.RedisHealthy && v.ReplicasSeen == 3
		})
	}
	bursts(t, rs, 2*time.Second, "settle")
	paused := rs[2].c.Proc
	t.Cleanup(func() { paused.Signal(syscall.SIGCONT) })
	out := duringFault(t, rs, 5*time.Second, "pause", func() {
		time.Sleep(time.Second)
		if err := paused.Signal(syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
		time.Sleep(600 * time.Millisecond)
		if err := paused.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
	})
	admittedWithin(t, out, "a replica paused 600 ms", 0.9)
	waitCluster(t, rs[2].c, "the paused replica synced again", func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 3
	})
	admittedWithin(t, bursts(t, rs, 3*time.Second, "after"), "after", 0.9)
}

// Three bin/caddy replicas whose wall clocks disagree, one 1.5 s ahead of
// the machine's and one 1.5 s behind (skewclock: the unmodified binary,
// its wall-clock reads answered with the offset), each more than the sync
// interval (250 ms) and the replica TTL (1 s). The limit follows the
// store's clock, so they still share one peer's limit of R/s: R ± 5 %
// over 10 s at the upstream, with the client offering 3R/s rotating over
// them; every replica sees the other two; each view shows its own
// offset from the store's clock. (Before epochs followed Redis' TIME,
// 0.8 s of skew admitted 1.67 R.)
func TestClusterClockSkew(t *testing.T) {
	e2e.SkipShort(t)
	const R = 100.0
	offsets := map[string]time.Duration{"r1": 1500 * time.Millisecond, "r2": 0, "r3": -1500 * time.Millisecond}
	ct := newClusterTopologyVia(t, replicaCaddyfile(R, false), func(host string) []string {
		return []string{e2e.Bin(t, "skewclock"), "-offset", offsets[host].String(), "--"}
	})
	tp := ct.tp
	ct.waitAll(t, "three replicas registered, each with its clock offset measured", ct.replicas, func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 3 && v.ClockOffsetMs != nil
	})
	for _, r := range ct.replicas {
		v := ct.view(r)
		want := float64(offsets[r].Milliseconds())
		t.Logf("%s: clock offset %+.1f ms (skewed %+v), rtt %.1f ms", r, *v.ClockOffsetMs, offsets[r], *v.ClockRTTMs)
		if math.Abs(*v.ClockOffsetMs-want) > 100 {
			t.Errorf("%s: the view says its clock is %+.1f ms off the store's, want %+.0f ± 100", r, *v.ClockOffsetMs, want)
		}
	}

	lc := startLoad(t, ct, 3*R, []string{tp.IP("r1"), tp.IP("r2"), tp.IP("r3")})
	time.Sleep(3 * time.Second) // shares settle from the floor to proportional
	lc.setTag("skewed")
	time.Sleep(10 * time.Second)
	lc.setTag("after")
	time.Sleep(500 * time.Millisecond) // answers in flight arrive
	got, w := ct.upstreamCounts(t)["skewed"], lc.window("skewed")
	if float64(w.sent) < 2*R*10 {
		t.Fatalf("the client offered only %d requests in 10 s (want ≥ 2R/s): the machine is too loaded to test the limit", w.sent)
	}
	if len(w.failed) > 0 {
		t.Errorf("%d of %d requests failed (not 200 or 429), e.g. %v", len(w.failed), w.sent, w.failed[:min(3, len(w.failed))])
	}
	t.Logf("clocks +1.5 s / 0 / -1.5 s: offered %d, upstream counted %d (limit %v/s × 10 s): %.3f × the limit", w.sent, got, R, float64(got)/(10*R))
	if !within(float64(got), 10*R, 0.05) {
		t.Errorf("upstream counted %d in 10 s, want %v ± 5 %%", got, 10*R)
	}
	for _, r := range ct.replicas {
		if v := ct.view(r); v == nil || v.ReplicasSeen != 3 {
			t.Errorf("%s: view %+v, want 3 replicas seen", r, v)
		}
	}
}
