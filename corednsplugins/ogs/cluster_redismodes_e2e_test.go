package ogs_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Two bin/coredns replicas on a replicated 3-master Redis Cluster and on
// a Sentinel-watched master: dozens of new locations queried on both at
// once get one probe run each and one order on both (whatever order the
// loaded host measured); while the shard of
// one location fails over (its master killed) or Sentinel moves the
// master, every query is answered; once the calls that fail while the
// clients find the new master have ended (the fallback rule: probed
// locally, counted), the replicas share runs again through it.
func TestClusterOnRedisModes(t *testing.T) {
	e2e.SkipShort(t)
	t.Run("cluster", func(t *testing.T) {
		rc := e2e.StartReplicatedRedisCluster(t, 3)
		redisModesRun(t, strings.Join(rc.Addrs[:3], " "), func() {
			dead := rc.FailMaster(t, storeKey("10.40.0.0/24"))
			t.Logf("killed %s, the master of 10.40.0.0/24's slot; its replica took over", rc.Addrs[dead])
		})
	})
	t.Run("sentinel", func(t *testing.T) {
		s := e2e.StartSentinel(t)
		redisModesRun(t, fmt.Sprintf("%s\n\t\t\tsentinel_master %s", s.SentinelAddr, s.Master), func() { s.Failover(t) })
	})
}

func redisModesRun(t *testing.T, store string, failover func()) {
	gws := clusterGateways(t)
	a, b := startReplica(t, gws, store, ""), startReplica(t, gws, store, "")
	rs := []*replica{a, b}
	orders := map[string]string{} // location → the one order every replica answers

	// newLocations queries n new locations from base on both replicas at
	// once, twice each: one run per location (2 probes × 3 gateways).
	newLocations := func(phase string, base, n int) {
		t.Helper()
		before, timeouts := totalConns(gws...), storeTimeouts(t, rs)
		errs := burstQueries(rs, locations(base, n), 2, orders, false)
		if len(errs) > 0 {
			t.Fatalf("%s: %d queries wrong, first: %v", phase, len(errs), errs[0])
		}
		if err := oneRunEach(t, rs, totalConns(gws...)-before, n, timeouts); err != nil {
			t.Fatalf("%s: %v", phase, err)
		}
		// The runs have ended: every replica answers every location its
		// result, one order, with the full TTL.
		if errs := burstQueries(rs, locations(base, n), 1, orders, true); len(errs) > 0 {
			t.Fatalf("%s, once the runs ended: %d queries wrong, first: %v", phase, len(errs), errs[0])
		}
	}
	newLocations("before the failover", 40, 24)

	// During the failover, known locations keep being answered.
	var during []error
	stop := e2e.Loop(1, func(int) bool {
		during = append(during, burstQueries(rs, locations(40, 24), 1, orders, true)...)
		return true
	})
	failover()
	stop()
	if len(during) > 0 {
		t.Fatalf("during the failover %d queries wrong, first: %v", len(during), during[0])
	}
	for i, r := range rs {
		r.WaitFor(t, "the store healthy again", 60*time.Second, func() error {
			if s := fetchAdmin(t, r.admin).Servers[0]; s.RedisHealthy == nil || !*s.RedisHealthy {
				return fmt.Errorf("replica %d: redis_healthy %v", i, s.RedisHealthy)
			}
			return nil
		})
	}
	// Until each client has the new master (a Cluster client reloads its
	// slot map on the first error from the dead node; a Sentinel client
	// follows the switch), a call may fail: the fallback rule (this
	// replica probes on its own, counted, and leaves Redis alone for a
	// second). Settle: bursts of new locations, each more than that
	// second after the last, until one passes with no store error on
	// either replica.
	storeErrors := func() (n float64) {
		for _, r := range rs {
			n += metric(t, r.metrics, "coredns_ogs_store_errors_total")
		}
		return n
	}
	settled := false
	for i := 0; i < 20 && !settled; i++ {
		time.Sleep(1200 * time.Millisecond)
		n := storeErrors()
		if errs := burstQueries(rs, locations(100+4*i, 4), 1, orders, false); len(errs) > 0 {
			t.Fatalf("settling: %d queries wrong, first: %v", len(errs), errs[0])
		}
		settled = storeErrors() == n
		t.Logf("settling burst %d: %v store errors in all", i, storeErrors())
	}
	for _, r := range rs { // which calls failed, for the record
		resp, err := http.Get("http://" + r.metrics + "/metrics")
		if err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(data), "\n") {
				if strings.HasPrefix(l, "coredns_ogs_store_errors_total{") {
					t.Log(l)
				}
			}
		}
	}
	if !settled {
		t.Fatal("store errors went on in 20 bursts after the failover")
	}
	newLocations("after the failover", 70, 24)
}

// locations are n ECS subnets 10.<base+i>.0.0/24.
func locations(base, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.0.0/24", base+i)
	}
	return out
}

// oneRunEach checks probes, the probes sent for n new locations (3
// gateways, 2 probes each) by the replicas rs, against the rule: one run
// per location. A store call that timed out (a loaded host: make test runs
// four test binaries at once) makes that replica probe that location on its
// own, as the README says: each timeout counted since before (storeTimeouts
// when the queries began) allows one extra run, no more, and never more
// than one run per replica and location.
func oneRunEach(t *testing.T, rs []*replica, probes int64, n int, before float64) error {
	t.Helper()
	timeouts := int64(storeTimeouts(t, rs) - before)
	const perRun = 6
	one := int64(perRun * n)
	extra := min(timeouts, int64(len(rs)-1)*int64(n)) * perRun
	if timeouts > 0 {
		t.Logf("%d store calls timed out, so replicas probed on their own: %d probes for %d new locations", timeouts, probes, n)
	}
	if probes < one || probes > one+extra {
		return fmt.Errorf("%d probes for %d new locations on %d replicas (%d store timeouts); want one run each (%d probes), plus at most one run (%d probes) per timeout",
			probes, n, len(rs), timeouts, one, perRun)
	}
	return nil
}

// storeTimeouts is the replicas' store calls that timed out, in all.
func storeTimeouts(t *testing.T, rs []*replica) (n float64) {
	for _, r := range rs {
		n += metricWith(t, r.metrics, "coredns_ogs_store_errors_total", `reason="timeout"`)
	}
	return n
}

// standInTTL is fallback_ttl's default: the TTL of an answer given while
// the location's run goes on (the README's Deadlines: a query waiting past
// answer_deadline, 1.5 s, gets the gateways heard from so far). On a
// loaded host, with 48 runs at once, some queries get one; it is not the
// run's result, so it is not held to the one order.
const standInTTL = 5

// burstQueries asks every replica for every location rounds times, all at
// once, and returns each failed query and each answer with the full TTL
// that differs from the location's order in orders (set from its first
// such answer if absent: a loaded host may measure two gateways in either
// order, but every replica must answer one location one order). With
// full, a stand-in answer is wrong too: the location's run has ended.
func burstQueries(rs []*replica, subnets []string, rounds int, orders map[string]string, full bool) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, r := range rs {
		for _, subnet := range subnets {
			for range rounds {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := exchange(r.Addr, "vpn.example.test", dns.TypeA, subnet)
					if err == nil && resp.Rcode != dns.RcodeSuccess {
						err = fmt.Errorf("rcode %s", dns.RcodeToString[resp.Rcode])
					}
					mu.Lock()
					defer mu.Unlock()
					ips, ttl := aRecords(resp)
					if err == nil && full && ttl <= standInTTL {
						err = fmt.Errorf("a stand-in answer (ttl %d) for a location whose run ended", ttl)
					}
					if err == nil && ttl > standInTTL {
						got := strings.Join(ips, " ")
						if want, ok := orders[subnet]; !ok {
							orders[subnet] = got
						} else if got != want {
							err = fmt.Errorf("order %s (ttl %d), another answer was %s", got, ttl, want)
						}
					}
					if err != nil {
						errs = append(errs, fmt.Errorf("%s from %s: %w", r.Addr, subnet, err))
					}
				}()
			}
		}
	}
	wg.Wait()
	return errs
}
