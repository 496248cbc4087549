package ogs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// usedMemory is redis-server's INFO memory used_memory.
func usedMemory(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}

// BenchmarkReportsRedis writes LOCATIONS locations of REPORTERS reporters
// of 10 gateways each through the plugin's Redis layout (PutVotes, one
// script call per report) into a fresh redis-server and reports Redis'
// bytes per location (INFO used_memory after minus before, over the
// locations) and the reports written a second from one client. Run with
// -benchtime 1x; scale the figure to 1 million locations.
func BenchmarkReportsRedis(b *testing.B) {
	const locations, gateways = 20_000, 10
	for _, reporters := range []int{3, 10} {
		b.Run(fmt.Sprintf("reporters=%d", reporters), func(b *testing.B) {
			_, addr := e2e.StartRedis(b)
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			st := &redisStore{client: c, ns: "edgesteer:ogs:vpn.example.test.:"}
			ctx := context.Background()
			before := usedMemory(b, c)
			now := time.Now()
			var votes []rttreports.StoredVote
			for g := range gateways {
				votes = append(votes, rttreports.StoredVote{Gateway: fmt.Sprintf("gw%02d.example.test", g), Value: rttreports.EncodeVote(time.Duration(10+g)*time.Millisecond+123*time.Microsecond, false, now), At: now})
			}
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				for l := range locations {
					loc := fmt.Sprintf("10.%d.%d.0/24", l/256, l%256)
					for r := range reporters {
						if err := st.PutVotes(ctx, loc, fmt.Sprintf("office|10.%d.%d.%d", l/256, l%256, r+1), votes, now, 4*time.Hour, rttreports.Bounds{Reporters: 32, PerToken: 32, Locations: 10_000_000}); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			used := usedMemory(b, c) - before
			if n := c.ZCard(ctx, st.reportsNS()+"idx").Val(); n != locations {
				b.Fatalf("%d locations indexed, want %d", n, locations)
			}
			b.ReportMetric(float64(used)/locations, "redis-bytes/location")
			b.ReportMetric(float64(b.N*locations*reporters)/elapsed.Seconds(), "reports/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
