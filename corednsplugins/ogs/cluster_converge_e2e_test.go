package ogs_test

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/gatewaysel"
)

// README, Cluster, rule 5, with `recheck off`: two replicas that probed a
// new location on their own while Redis was stopped (SIGSTOP, 3 s), and
// picked different first gateways, answer one order, the stored one,
// within two re-check intervals and a store timeout of Redis answering.
//
// The bound is measured from SIGCONT on the test's clock, against twice
// the README's bound (2 × (2 × 1 s + 250 ms) = 4.5 s): the slack is for a
// loaded host (timers and processes late by a second in all), and it still
// fails on the fault this guards: a get-or-lock that Redis ran only on
// resuming, after the replica had given up on it, left a lock that no one
// released, and both replicas waited for it to expire (its lifetime is
// the 7 s deadline and two store timeouts: 7.5 s; they agreed 8.05 s
// after the resume here, between 7.8 and 10.8 s in issue 48).
func TestClusterConvergesAfterRedisPause(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	rp, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	// The answer deadline well past a run that follows a store timeout,
	// so each replica answers its own finished run (a loaded host).
	extra := "\t\tanswer_deadline 5s\n"
	a, b := startReplica(t, gws, redisAddr, extra), startReplica(t, gws, redisAddr, extra)
	const subnet = "10.9.0.0/24"
	setDelays := func(ms3 ...time.Duration) {
		for i, g := range gws {
			g.delay.Store(int64(ms3[i]))
		}
	}

	// Redis in use before the pause (as in production): its script cache
	// holds the plugin's scripts, so a call that waited in its socket runs
	// on resuming (not NOSCRIPT).
	query(t, a.Addr, "10.8.0.0/24")
	a.WaitFor(t, "the first result in Redis", 30*time.Second, func() error { return rdb.Get(context.Background(), storeKey("10.8.0.0/24")).Err() })
	query(t, b.Addr, "10.8.0.0/24")

	if err := rp.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Signal(syscall.SIGCONT) })
	stopped := time.Now()
	// a measures gw1 first, b gw2 first: the replicas disagree, as two
	// replicas that measured three gateways at equal distance may.
	setDelays(100*ms, 200*ms, 300*ms)
	ipsA, ttlA := query(t, a.Addr, subnet)
	setDelays(200*ms, 100*ms, 300*ms)
	ipsB, ttlB := query(t, b.Addr, subnet)
	setDelays(100*ms, 100*ms, 100*ms)
	if ipsA[0] != "127.0.0.11" || ipsB[0] != "127.0.0.12" || ttlA != 30 || ttlB != 30 {
		t.Fatalf("with Redis stopped: a %v (ttl %d), b %v (ttl %d); want each its own run, gw1 and gw2 first", ipsA, ttlA, ipsB, ttlB)
	}
	time.Sleep(3*time.Second - time.Since(stopped))
	if err := rp.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	agreeWithin(t, rdb, a, b, subnet, resumed, "Redis resumed")
}

// agreeWithin waits until replicas a and b answer subnet with one order,
// and fails unless they do within twice the README's bound (Cluster, rule
// 5: two re-check intervals and a store timeout, 2.25 s with recheck off)
// of since, the store answering again, or unless that order is the one
// Redis holds and both keep answering it.
func agreeWithin(t *testing.T, rdb *redis.Client, a, b *replica, subnet string, since time.Time, what string) {
	t.Helper()
	interval, storeTimeout := time.Second, gatewaysel.DefaultStoreTimeout // recheck off: every second
	bound := 2 * (2*interval + storeTimeout)
	var agreed time.Duration
	var last [2][]string
	for agreed == 0 && time.Since(since) < bound+10*time.Second {
		time.Sleep(50 * ms)
		last[0], _ = query(t, a.Addr, subnet)
		last[1], _ = query(t, b.Addr, subnet)
		if slices.Equal(last[0], last[1]) {
			agreed = time.Since(since)
		}
	}
	t.Logf("the replicas agreed %v after %s (bound %v)", agreed, what, bound)
	if agreed == 0 || agreed > bound {
		t.Fatalf("a answers %v and b %v %v after %s (agreed after %v); want one order within %v", last[0], last[1], time.Since(since), what, agreed, bound)
	}
	// The order they agree on is the stored one, and stays.
	v, err := rdb.Get(context.Background(), storeKey(subnet)).Result()
	if err != nil {
		t.Fatalf("nothing stored: %v", err)
	}
	first := map[string]string{"127.0.0.11": "gw1", "127.0.0.12": "gw2", "127.0.0.13": "gw3"}[last[0][0]]
	if !strings.Contains(v, `"order":["`+first+`.example.test"`) {
		t.Fatalf("both answer %v, Redis holds %s", last[0], v)
	}
	for _, r := range []*replica{a, b} {
		if ips, _ := query(t, r.Addr, subnet); !slices.Equal(ips, last[0]) {
			t.Fatalf("%s answers %v after agreeing on %v", r.Addr, ips, last[0])
		}
	}
}

// README, Cluster, rule 6, with `recheck off`: Redis killed and restarted
// empty loses the result a stored and both replicas answer from memory;
// b, asked for the location after the restart, may probe it again
// (another measure: another order) and write its own. Within two re-check
// intervals and a store timeout of Redis answering, both answer one order,
// the stored one (twice that bound, for a loaded host, as above). On the
// code before the generation marker a answered its order and b the other
// until the entry's ttl: never within the bound.
func TestClusterConvergesAfterRedisRestartEmpty(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	redisAddr := e2e.Addr(t)
	rp := e2e.StartRedisAt(t, t.TempDir(), redisAddr)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	extra := "\t\tanswer_deadline 5s\n"
	a, b := startReplica(t, gws, redisAddr, extra), startReplica(t, gws, redisAddr, extra)
	setDelays := func(ms3 ...time.Duration) {
		for i, g := range gws {
			g.delay.Store(int64(ms3[i]))
		}
	}
	// Both replicas past a re-check tick (each reads the generation
	// marker there), Redis' script cache warm.
	query(t, a.Addr, "10.8.0.0/24")
	query(t, b.Addr, "10.8.0.0/24")
	time.Sleep(2500 * ms)

	const subnet = "10.9.0.0/24"
	setDelays(100*ms, 200*ms, 300*ms) // a measures gw1 first
	if ips, _ := query(t, a.Addr, subnet); ips[0] != "127.0.0.11" {
		t.Fatalf("a answers %v, want gw1 first", ips)
	}
	a.WaitFor(t, "a's result in Redis", 30*time.Second, func() error { return rdb.Get(context.Background(), storeKey(subnet)).Err() })

	rp.Kill()
	e2e.StartRedisAt(t, t.TempDir(), redisAddr) // empty
	answering := time.Now()
	setDelays(200*ms, 100*ms, 300*ms) // a run now measures gw2 first
	ipsB, _ := query(t, b.Addr, subnet)
	setDelays(100*ms, 100*ms, 100*ms)
	t.Logf("b, asked after the restart, answers %v (gw2 first: its own run; gw1: a's result, already taken back)", ipsB)
	agreeWithin(t, rdb, a, b, subnet, answering, "Redis answered again, empty")
}
