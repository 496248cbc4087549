package ogs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// startACLReplica is a replica whose store block logs in as user.
func startACLReplica(t *testing.T, gws []*countingGateway, redisAddr, user string) *replica {
	r := &replica{metrics: e2e.Addr(t), admin: e2e.Addr(t)}
	cf := strings.Replace(clusterCorefile(gws, redisAddr, r.metrics, r.admin, ""), "key_prefix e2e\n",
		fmt.Sprintf("key_prefix e2e\n\t\t\tusername %s\n\t\t\tpassword pw-%s\n", user, user), 1)
	r.CoreDNS = e2e.StartCoreDNS(t, cf, "other.example.test A")
	return r
}

// troubles is the admin view's redis_troubles.
type troubles struct {
	Servers []struct {
		RedisHealthy  *bool `json:"redis_healthy"`
		RedisTroubles []struct {
			Keys      string    `json:"keys"`
			Pattern   string    `json:"key_pattern"`
			Operation string    `json:"operation"`
			Reason    string    `json:"reason"`
			Error     string    `json:"error"`
			Since     time.Time `json:"since"`
		} `json:"redis_troubles"`
	} `json:"servers"`
}

// Two replicas logged in as ACL users that may touch only part of ogs's
// keys — one the values but not the locks, the other the locks but not the
// values: each answers every query from a local run (the documented
// fallback), and says which keys fail, on which operation and why, in the
// admin view, the metrics and the log (once, however many locations run
// into it); when the ACL is widened, each logs once that Redis answers
// again, the view clears, and results are shared again.
func TestClusterACLPartialKeys(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	ns := "e2e:ogs:vpn.example.test.:"
	acl := func(user string, patterns ...string) {
		args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw-" + user, "+@all"}
		for _, p := range patterns {
			args = append(args, "~"+p)
		}
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Each may touch the generation marker (Cluster, rule 6: the README's
	// ~KEY_PREFIX:ogs:NAME:* holds it too).
	acl("values", ns+"ecs:*", ns+"generation{*") // not ns+"lock:*"
	acl("locks", ns+"lock:*", ns+"generation{*")
	cases := []aclCase{
		{startACLReplica(t, gws, redisAddr, "values"), "lock", ns + "lock:*", "lock"},
		{startACLReplica(t, gws, redisAddr, "locks"), "value", ns + "*", "value"},
	}

	// New locations on both, over more than the store's one-second rest,
	// so each replica goes back to Redis and is refused again.
	for i := range 3 {
		for k, c := range cases {
			subnet := fmt.Sprintf("10.%d.%d.0/24", 40+k, i)
			before := totalConns(gws...)
			// A measured order (the full ttl; the exact order is the
			// gateways', and a loaded host may swap two of them).
			if ips, ttl := query(t, c.r.Addr, subnet); len(ips) != 3 || ttl != 30 {
				t.Fatalf("%s user, %s: %v ttl %d; want a measured order with the full ttl", c.keys, subnet, ips, ttl)
			}
			if n := totalConns(gws...) - before; n != 6 {
				t.Fatalf("%s user, %s: %d probes; want a local run (6)", c.keys, subnet, n)
			}
		}
		time.Sleep(1100 * time.Millisecond)
	}
	for _, c := range cases {
		checkACLTrouble(t, c)
	}
	if n := append(rdb.Keys(ctx, ns+"ecs:*").Val(), rdb.Keys(ctx, ns+"lock:*").Val()...); len(n) != 0 {
		t.Fatalf("%v written by users who may not take the locks or write the values", n)
	}

	// Widened: both answer again, once, and share results again.
	acl("values", ns+"*")
	acl("locks", ns+"*")
	time.Sleep(1100 * time.Millisecond)
	for k, c := range cases {
		subnet := fmt.Sprintf("10.%d.9.0/24", 40+k)
		query(t, c.r.Addr, subnet)
		c.r.WaitFor(t, "healthy again", 30*time.Second, func() error {
			var v troubles
			getJSON(t, c.r.admin, &v)
			if s := v.Servers[0]; !*s.RedisHealthy || len(s.RedisTroubles) != 0 {
				return fmt.Errorf("admin %+v", s)
			}
			return nil
		})
		if n := strings.Count(c.r.Logs(), "answering again on "+c.pattern); n != 1 {
			t.Fatalf("%s user: return logged %d times:\n%s", c.keys, n, c.r.Logs())
		}
		if err := rdb.Get(ctx, storeKey(subnet)).Err(); err != nil {
			t.Fatalf("%s user: %s not shared after the ACL was widened: %v", c.keys, subnet, err)
		}
	}
	// The other replica answers it from Redis, with no probe.
	before := totalConns(gws...)
	stored, _ := query(t, cases[0].r.Addr, "10.40.9.0/24")
	if ips, _ := query(t, cases[1].r.Addr, "10.40.9.0/24"); !slices.Equal(ips, stored) || totalConns(gws...) != before {
		t.Fatalf("replica 2: %v after %d probes", ips, totalConns(gws...)-before)
	}
}

// aclCase is a replica logged in as an ACL user refused some of ogs's keys:
// keys and pattern as the admin view and the log name those.
type aclCase struct {
	r              *replica
	keys, pattern  string
	refusedKeyword string
}

// checkACLTrouble checks that c's replica says, in the admin view, the
// metrics and the log (once), which keys Redis refused, on which operation
// and why, and that each location was probed locally.
func checkACLTrouble(t *testing.T, c aclCase) {
	t.Helper()
	var v troubles
	getJSON(t, c.r.admin, &v)
	s := v.Servers[0]
	if s.RedisHealthy == nil || *s.RedisHealthy || len(s.RedisTroubles) != 1 {
		t.Fatalf("%s user: admin %+v; want unhealthy with one trouble", c.keys, s)
	}
	tr := s.RedisTroubles[0]
	if tr.Keys != c.keys || tr.Pattern != c.pattern || tr.Operation != "get_or_lock" || tr.Reason != "noperm" || !strings.Contains(tr.Error, "NOPERM") || tr.Since.IsZero() {
		t.Fatalf("%s user: trouble %+v", c.keys, tr)
	}
	series := fmt.Sprintf(`coredns_ogs_store_errors_total{keys=%q,operation="get_or_lock",reason="noperm"}`, c.keys)
	// One per location that went to Redis, and per reconcile step that
	// took the results probed meanwhile back to it (also refused).
	if n, all := metric(t, c.r.metrics, series), metric(t, c.r.metrics, "coredns_ogs_store_errors_total"); n < 1 || all < 3 {
		t.Fatalf("%s user: %s = %v, %v store errors in all; want at least 1 and 3", c.keys, series, n, all)
	}
	logs := c.r.Logs()
	line := fmt.Sprintf("get_or_lock failed on %s (noperm", c.pattern)
	if n := strings.Count(logs, "probing locally until it answers again"); n != 1 || !strings.Contains(logs, line) {
		t.Fatalf("%s user: the trouble logged %d times (want once, with %q):\n%s", c.keys, n, line, logs)
	}
	if runs := metric(t, c.r.metrics, "coredns_ogs_probe_runs_total"); runs != 3 {
		t.Fatalf("%s user: %v probe runs", c.keys, runs)
	}
}

func getJSON(t *testing.T, addr string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/ogs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
