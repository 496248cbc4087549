package quotaredis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/quota"
)

// BenchmarkRedisSyncTime is one replica's sync round trip to a real
// redis-server (heartbeat, 10 active peers' counts and reads), with and
// without TIME in the pipeline: the cost the store's clock adds.
func BenchmarkRedisSyncTime(b *testing.B) {
	_, addr := e2e.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	s := New(c)
	for _, withTime := range []bool{false, true} {
		b.Run(fmt.Sprintf("time=%v", withTime), func(b *testing.B) {
			ctx := context.Background()
			now := time.Now()
			var counts []quota.Count
			var read []string
			for i := range 10 {
				p := fmt.Sprintf("peer-%d", i)
				counts = append(counts, quota.Count{Peer: p, Admitted: 5, Demanded: 7})
				read = append(read, p)
			}
			for b.Loop() {
				e := now.UnixNano() / int64(250*time.Millisecond)
				ans, err := s.Sync(ctx, &quota.Batch{Prefix: "bench", Replica: "r1", Now: now, Epoch: e, ReplicaTTL: time.Second,
					KeyTTL: 750 * time.Millisecond, Counts: counts, Read: read, Time: withTime})
				if err != nil || len(ans.Totals) != len(read) || (withTime && ans.Time.IsZero()) {
					b.Fatalf("sync: %v %+v", err, ans)
				}
			}
		})
	}
}
