package ogs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Two bin/coredns replicas whose wall clocks disagree by 3 s (skewclock:
// one 1.5 s ahead of the machine's, one 1.5 s behind) share one Redis:
// locks and the lifetime of a stored result are Redis' (PX), and a stored
// result's probe time is accepted up to a minute ahead of the reader's
// clock, so 24 new locations queried on both at once get one probe run
// each, one order on both, and no stored value is refused as malformed
// or stale.
func TestClusterClockSkew(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	var rs []*replica
	for _, off := range []string{"1.5s", "-1.5s"} {
		r := &replica{metrics: e2e.Addr(t), admin: e2e.Addr(t)}
		r.CoreDNS = e2e.StartCoreDNSVia(t, clusterCorefile(gws, redisAddr, r.metrics, r.admin, ""), "other.example.test A",
			[]string{e2e.Bin(t, "skewclock"), "-offset", off, "--"})
		rs = append(rs, r)
	}
	orders := map[string]string{}
	subnets := locations(40, 24)
	for round := range 2 {
		if errs := burstQueries(rs, subnets, 2, orders, round > 0); len(errs) > 0 { // round 1: the runs have ended
			t.Fatalf("round %d: %d queries wrong, first: %v", round, len(errs), errs[0])
		}
	}
	if err := oneRunEach(t, rs, totalConns(gws...), len(subnets), 0); err != nil {
		t.Fatalf("two replicas 3 s apart: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	for _, s := range subnets {
		if ttl := rdb.PTTL(context.Background(), storeKey(s)).Val(); ttl < 13*24*time.Hour {
			t.Fatalf("%s: stored with TTL %v, want the cache lifetime (14d)", s, ttl)
		}
	}
	for i, r := range rs {
		bad, stale := metric(t, r.metrics, "coredns_ogs_store_malformed_total"), metric(t, r.metrics, "coredns_ogs_store_stale_total")
		hits := metric(t, r.metrics, `coredns_ogs_store_hits_total{level="redis"}`)
		t.Logf("replica %d (%s): %v Redis hits, %v malformed, %v stale", i, []string{"+1.5 s", "-1.5 s"}[i], hits, bad, stale)
		if bad != 0 || stale != 0 {
			t.Errorf("replica %d refused stored values: %v malformed, %v stale", i, bad, stale)
		}
		if s := fetchAdmin(t, r.admin).Servers[0]; s.RedisHealthy == nil || !*s.RedisHealthy {
			t.Errorf("replica %d: redis_healthy %v", i, s.RedisHealthy)
		}
		if strings.Contains(r.Logs(), "in the future") {
			t.Errorf("replica %d logged a value from the future", i)
		}
	}
}
