package quota

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// BenchmarkAllow is a replica's per-request cost with a cluster-wide limit
// (Quota.Allow: the peer's share bucket) against the anchor of a local
// limit (ratelimit.Table: the bounded per-peer table and GCRA), 1,024
// peers, clock read included.
func BenchmarkAllow(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	b.Run("anchor_local_table/parallel", func(b *testing.B) {
		rule, _ := ratelimit.NewRule("x", 1e9, 1e9)
		tb := ratelimit.NewTable(100_000)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				now := time.Now().UnixNano()
				tb.Bucket(keys[i%len(keys)], now).Allow(rule, now)
				i++
			}
		})
	})
	b.Run("quota/parallel", func(b *testing.B) {
		q, err := New(Config{Prefix: "b", Replica: "r", Limit: 1e9, MaxPeers: 100_000}, NewFakeStore())
		if err != nil {
			b.Fatal(err)
		}
		// Checked once per run: a limit far above the offered rate admits
		// (at the floor share of one replica, 10⁸/s), and a limit of 1/s
		// refuses after its burst.
		if !q.Allow("check", time.Now().UnixNano()) {
			b.Fatal("Allow refused under a limit of 1e9/s")
		}
		tight, _ := New(Config{Prefix: "b", Replica: "r", Limit: 1}, NewFakeStore())
		now := time.Now().UnixNano()
		if tight.Allow("x", now); tight.Allow("x", now) && tight.Allow("x", now) {
			b.Fatal("Allow admitted 3 at once under a limit of 1/s")
		}
		b.ResetTimer()
		var refused atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if !q.Allow(keys[i%len(keys)], time.Now().UnixNano()) {
					refused.Add(1)
				}
				i++
			}
		})
		if n := refused.Load(); n != 0 {
			b.Fatalf("%d requests refused under a limit of 1e9/s", n)
		}
	})
}

// BenchmarkRedisSyncTime is one replica's sync round trip to a real
// redis-server (heartbeat, 10 active peers' counts and reads), with and
// without TIME in the pipeline: the cost the store's clock adds.
func BenchmarkRedisSyncTime(b *testing.B) {
	_, addr := e2e.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	s := NewRedisStore(c)
	for _, withTime := range []bool{false, true} {
		b.Run(fmt.Sprintf("time=%v", withTime), func(b *testing.B) {
			ctx := context.Background()
			now := time.Now()
			var counts []Count
			var read []string
			for i := range 10 {
				p := fmt.Sprintf("peer-%d", i)
				counts = append(counts, Count{Peer: p, Admitted: 5, Demanded: 7})
				read = append(read, p)
			}
			for b.Loop() {
				e := now.UnixNano() / int64(250*time.Millisecond)
				ans, err := s.Sync(ctx, &Batch{Prefix: "bench", Replica: "r1", Now: now, Epoch: e, ReplicaTTL: time.Second,
					KeyTTL: 750 * time.Millisecond, Counts: counts, Read: read, Time: withTime})
				if err != nil || len(ans.Totals) != len(read) || (withTime && ans.Time.IsZero()) {
					b.Fatalf("sync: %v %+v", err, ans)
				}
			}
		})
	}
}
