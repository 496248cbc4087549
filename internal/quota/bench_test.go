package quota

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
		now, admitted := time.Now().UnixNano(), 0
		for range 3 {
			if tight.Allow("x", now) {
				admitted++
			}
		}
		if admitted == 3 {
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
