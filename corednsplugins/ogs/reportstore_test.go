package ogs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// Redis bounds a location's reporters by the local table's rule: a token
// rotating its networks (eight reporters of the token "liar") keeps at
// most max_reporters_per_token of them and, in a full location, pushes out
// its own, never the honest reporters of other tokens; their votes go with
// them. Against a real redis-server.
func TestRedisReportersBoundedPerToken(t *testing.T) {
	_, addr := e2e.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	st := &redisStore{client: c, ns: "t:ogs:vpn.example.test.:"}
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	for _, b := range []rttreports.Bounds{{Reporters: 5, PerToken: 2, Locations: 100}, {Reporters: 4, PerToken: 4, Locations: 100}} {
		loc := fmt.Sprintf("10.%d.0.0/24", b.Reporters)
		put := func(who string, at time.Time) {
			v := []rttreports.StoredVote{{Gateway: "gw1", Value: rttreports.EncodeVote(time.Millisecond, false, at), At: at}}
			if err := st.PutVotes(ctx, loc, who, v, at, 4*time.Hour, b); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			put(fmt.Sprintf("h%d|10.0.0.%d/32", i, i), t0.Add(time.Duration(i)*time.Second))
		}
		for i := range 8 {
			put(fmt.Sprintf("liar|2001:db8:0:%x::/64", i), t0.Add(time.Minute+time.Duration(i)*time.Second))
		}
		base := st.reportsNS()
		reporters, err := c.ZRange(ctx, base+"r:"+loc, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		liars := min(b.PerToken, b.Reporters-3)
		want := []string{"h0|10.0.0.0/32", "h1|10.0.0.1/32", "h2|10.0.0.2/32"}
		for i := 8 - liars; i < 8; i++ {
			want = append(want, fmt.Sprintf("liar|2001:db8:0:%x::/64", i))
		}
		if !slices.Equal(reporters, want) {
			t.Fatalf("bounds %+v: reporters %v, want %v", b, reporters, want)
		}
		fields, _ := c.HKeys(ctx, base+"v:"+loc).Result()
		for i := range fields {
			fields[i], _, _ = strings.Cut(fields[i], " ")
		}
		slices.Sort(fields)
		if !slices.Equal(fields, want) {
			t.Fatalf("bounds %+v: votes of %v, want of %v", b, fields, want)
		}
	}
}
