package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// TestRedisClusterAndSentinel: the documented Cluster and Sentinel configs
// of edgesteer_redis / ogs's store redis reach the servers these helpers
// start, keys spread over the three masters, and a Sentinel failover moves
// the client to the promoted replica.
func TestRedisClusterAndSentinel(t *testing.T) {
	ctx := context.Background()
	t.Run("cluster", func(t *testing.T) {
		rc := StartRedisCluster(t, 3)
		cfg := &redisconn.Config{Addresses: rc.Addrs[:1], Cluster: true}
		cfg.FillDefaults()
		c, release, err := redisconn.Acquire("test-cluster", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		for i := 0; i < 30; i++ {
			if err := c.Set(ctx, fmt.Sprintf("k%d", i), i, time.Minute).Err(); err != nil {
				t.Fatalf("SET through the cluster client: %v", err)
			}
		}
		for _, a := range rc.Addrs { // every master holds some of the keys
			n := redisClient(a).DBSize(ctx).Val()
			if n == 0 {
				t.Errorf("master %s holds no key of 30: the client does not spread over the cluster", a)
			}
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		s := StartSentinel(t)
		cfg := &redisconn.Config{Addresses: []string{s.SentinelAddr}, SentinelMaster: s.Master}
		cfg.FillDefaults()
		c, release, err := redisconn.Acquire("test-sentinel", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		if err := c.Set(ctx, "before", "1", time.Minute).Err(); err != nil {
			t.Fatalf("SET through Sentinel: %v", err)
		}
		if got := redisClient(s.MasterAddr).Get(ctx, "before").Val(); got != "1" {
			t.Fatalf("the master at %s does not hold the key written through Sentinel (%q)", s.MasterAddr, got)
		}
		s.Failover(t)
		var err2 error
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) { // the client follows the new master
			if err2 = c.Set(ctx, "after", "2", time.Minute).Err(); err2 == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err2 != nil {
			t.Fatalf("SET after the failover: %v", err2)
		}
		if got := redisClient(s.ReplAddr).Get(ctx, "after").Val(); got != "2" {
			t.Fatalf("the promoted replica at %s does not hold the key written after the failover (%q)", s.ReplAddr, got)
		}
	})
}
