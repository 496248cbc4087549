package latencybucket_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The layer 4 policy shares its pins through Redis too: two bin/caddy
// replicas with the same layer4 config send each client IP (the user) to
// one publisher; the pins are in Redis under the policy's key namespace,
// and a value there that is not one of the policy's publishers is ignored,
// counted and overwritten, never followed.
func TestLayer4ClusterStickinessThroughRedis(t *testing.T) {
	_, redisAddr := e2e.StartRedis(t)
	pubs, _ := publishers(t, 0, 0, 0) // equally near: a replica alone picks at random
	config := func(front string, timeout ...string) string {
		to := "2s"
		if len(timeout) > 0 {
			to = timeout[0]
		}
		return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
	layer4 {
		%s {
			route {
				proxy %s {
					lb_policy latency_bucket {
						name l4-apps
						probe_interval 200ms
						sticky_app db
						sticky_store redis main
						sticky_store_timeout %s
					}
					lb_try_duration 5s
				}
			}
		}
	}
}
`, redisAddr, front, strings.Join(pubs, " "), to)
	}
	fronts := []string{e2e.Addr(t), e2e.Addr(t)}
	var caddies []*e2e.Caddy
	for _, f := range fronts {
		c := e2e.StartCaddy(t, "caddyfile", config(f))
		c.WaitTCP(t, f)
		adminView(t, c, "l4-apps", 3)
		caddies = append(caddies, c)
	}

	const users = 30
	used := map[string]bool{}
	for i := range users {
		src := fmt.Sprintf("127.0.3.%d", i+1)
		var first string
		for round := range 4 {
			p, err := dialL4(fronts[(i+round)%2], src)
			if err != nil {
				t.Fatalf("user %s round %d: %v", src, round, err)
			}
			if round == 0 {
				first = p
			} else if p != first {
				t.Fatalf("user %s went to %s on replica %d, first to %s", src, p, (i+round)%2, first)
			}
		}
		used[first] = true
	}
	if len(used) < 2 {
		t.Fatalf("%d users all on one publisher: the test proves nothing", users)
	}

	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rc.Close()
	ctx := context.Background()
	// (The harness's readiness connections come from 127.0.0.1.)
	keys, err := rc.Keys(ctx, "edgesteer:latency_bucket:l4-apps:127.0.3.*").Result()
	if err != nil || len(keys) != users {
		t.Fatalf("keys in Redis: %d %v, want %d", len(keys), err, users)
	}
	for _, k := range keys {
		v, _ := rc.Get(ctx, k).Result()
		ttl, _ := rc.PTTL(ctx, k).Result()
		if !strings.Contains(strings.Join(pubs, " "), v) || v == "" || ttl <= 0 {
			t.Fatalf("%s = %q (ttl %v): want a publisher address with an expiry", k, v, ttl)
		}
	}

	// A value that is not a publisher of the policy, and a key of another
	// type: ignored, counted, overwritten with a real pick.
	bad := "edgesteer:latency_bucket:l4-apps:127.0.4.1:db"
	rc.Set(ctx, bad, "10.9.9.9:1", 0)
	hash := "edgesteer:latency_bucket:l4-apps:127.0.4.2:db"
	rc.HSet(ctx, hash, "f", "v")
	for _, src := range []string{"127.0.4.1", "127.0.4.2"} {
		if _, err := dialL4(fronts[0], src); err != nil {
			t.Fatalf("user %s with a bad Redis value: %v", src, err)
		}
	}
	for _, k := range []string{bad, hash} {
		if v, err := rc.Get(ctx, k).Result(); err != nil || !strings.Contains(strings.Join(pubs, " "), v) {
			t.Fatalf("%s after the pick: %q %v, want a publisher", k, v, err)
		}
	}
	if n, ok := caddies[0].Metric(t, `caddy_edgesteer_latency_bucket_store_malformed_total{policy="l4-apps"}`); !ok || n != 2 {
		t.Fatalf("malformed metric %v %v, want 2", n, ok)
	}
	for i, c := range caddies {
		if n, ok := c.Metric(t, `caddy_edgesteer_latency_bucket_store_hits_total{level="redis",policy="l4-apps"}`); !ok || n == 0 {
			t.Fatalf("replica %d: no Redis hits (%v %v)", i, n, ok)
		}
	}

	// A reload that changes the store timeout keeps the pins and the
	// counts; the new timeout is in force.
	var before []latencybucket.PolicyView
	caddies[0].AdminJSON(t, "/latency_bucket/", &before)
	caddies[0].Reload(t, "caddyfile", config(fronts[0], "1500ms"))
	var after []latencybucket.PolicyView
	caddies[0].AdminJSON(t, "/latency_bucket/", &after)
	if len(after) != 1 || after[0].StickyStore == nil || after[0].StickyStore.TimeoutMS != 1500 ||
		after[0].StickyStore.Writes != before[0].StickyStore.Writes || after[0].StickyEntries != before[0].StickyEntries {
		t.Fatalf("after the reload: %+v; before: %+v", after, before)
	}
	for i := range users {
		src := fmt.Sprintf("127.0.3.%d", i+1)
		p1, err1 := dialL4(fronts[0], src)
		p2, err2 := dialL4(fronts[1], src)
		if err1 != nil || err2 != nil || p1 != p2 {
			t.Fatalf("user %s after the reload: %s %v / %s %v", src, p1, err1, p2, err2)
		}
	}
}
