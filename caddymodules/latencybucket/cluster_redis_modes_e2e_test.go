package latencybucket_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/pubsel"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// The sticky store on a replicated 3-master Redis Cluster and on a
// Sentinel-watched master, through two bin/caddy replicas: pairs pinned
// at once on both replicas are one pin each, in Redis; while the shard of
// some pairs fails over (its master killed) or Sentinel moves the master,
// no request fails and no pair leaves its publisher; afterwards every pin
// acknowledged before is still in Redis, on the new master, and new pairs
// are shared again.
func TestStickyStoreOnRedisModes(t *testing.T) {
	e2e.SkipShort(t)
	t.Run("cluster", func(t *testing.T) {
		rc := e2e.StartReplicatedRedisCluster(t, 3)
		stickyModesRun(t, strings.Join(rc.Addrs[:3], " "), &redisconn.Config{Addresses: rc.Addrs[:3], Cluster: true},
			func(key string) {
				dead := rc.FailMaster(t, key)
				t.Logf("killed %s, the master of %s's slot; its replica took over", rc.Addrs[dead], key)
			})
	})
	t.Run("sentinel", func(t *testing.T) {
		s := e2e.StartSentinel(t)
		stickyModesRun(t, fmt.Sprintf("%s\n\t\tsentinel_master %s", s.SentinelAddr, s.Master),
			&redisconn.Config{Addresses: []string{s.SentinelAddr}, SentinelMaster: s.Master}, func(string) { s.Failover(t) })
	})
}

func stickyModesRun(t *testing.T, store string, direct *redisconn.Config, failover func(key string)) {
	pubs, _ := publishers(t, 0, 0, 0)
	fronts := []string{e2e.Addr(t), e2e.Addr(t)}
	var caddies []*e2e.Caddy
	for _, f := range fronts {
		c := e2e.StartCaddy(t, "caddyfile", stickyStoreCaddyfile(store, f, "modes", pubs))
		c.WaitTCP(t, f)
		adminView(t, c, "modes", 3)
		caddies = append(caddies, c)
	}
	direct.FillDefaults()
	rdb, err := redisconn.New(direct)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	prefix := "edgesteer:latency_bucket:modes"

	var mu sync.Mutex
	pins := map[string]string{} // user → the one publisher both replicas send it to
	// burst asks both replicas for every user at once and returns each
	// failure and each answer off the user's pin (set by its first answer).
	burst := func(users []string) []error {
		var errs []error
		e2e.Together(len(users)*len(fronts), func(k int) {
			u, i := users[k/len(fronts)], k%len(fronts)
			req, _ := http.NewRequest("GET", "http://"+fronts[i]+"/", nil)
			req.Host = "app.example"
			req.Header.Set("X-User", u)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("%s", resp.Status)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				got := resp.Header.Get("X-Publisher")
				if pin, ok := pins[u]; !ok {
					pins[u] = got
				} else if got != pin {
					err = fmt.Errorf("sent to %s, pinned to %s", got, pin)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s on replica %d: %w", u, i, err))
			}
		})
		return errs
	}
	// stored checks that Redis holds every user's pin. A pin made while a
	// call failed is pending, written at the pair's next use at least a
	// second later (the README's reconciliation): a pair not there yet is
	// used again, on both replicas, while the check waits.
	stored := func(phase string, users []string) {
		t.Helper()
		ctx := context.Background()
		for _, u := range users {
			key := pubsel.StickyStoreKey(prefix, u, "app.example")
			deadline := time.Now().Add(20 * time.Second)
			for {
				v, err := rdb.Get(ctx, key).Result()
				if err == nil && v == pins[u] {
					break
				}
				if time.Now().After(deadline) || (err == nil && v != pins[u]) {
					t.Fatalf("%s: Redis holds %q (%v) for %s, pinned to %s", phase, v, err, key, pins[u])
				}
				time.Sleep(300 * time.Millisecond)
				if errs := burst([]string{u}); len(errs) > 0 {
					t.Fatalf("%s: %v", phase, errs[0])
				}
			}
		}
	}
	healthy := func() {
		t.Helper()
		for i, c := range caddies {
			deadline := time.Now().Add(30 * time.Second)
			for {
				var v []latencybucket.PolicyView
				c.AdminJSON(t, "/latency_bucket/", &v)
				if len(v) == 1 && v[0].StickyStore != nil && v[0].StickyStore.Healthy && !v[0].StickyStore.Refusing {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %d's store never healthy again: %+v", i, v)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}

	before := names("before", 30)
	for range 2 {
		if errs := burst(before); len(errs) > 0 {
			t.Fatalf("before the failover: %d requests wrong, first: %v", len(errs), errs[0])
		}
	}
	stored("before the failover", before)

	var during []error
	stop := e2e.Loop(1, func(int) bool {
		errs := burst(before)
		mu.Lock()
		during = append(during, errs...)
		mu.Unlock()
		return true
	})
	failover(pubsel.StickyStoreKey(prefix, before[0], "app.example"))
	stop()
	if len(during) > 0 {
		t.Fatalf("during the failover: %d requests wrong, first: %v", len(during), during[0])
	}
	healthy()
	stored("after the failover, the pins of before", before)

	after := names("after", 30)
	for range 2 {
		if errs := burst(after); len(errs) > 0 {
			t.Fatalf("after the failover: %d requests wrong, first: %v", len(errs), errs[0])
		}
	}
	stored("after the failover", after)
}
