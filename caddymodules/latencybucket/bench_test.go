package latencybucket

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// benchPool provisions an HTTPPolicy over n real loopback listeners and
// waits until every one is measured (all land in [0,32)).
func benchPool(b *testing.B, n int, sticky string) (*HTTPPolicy, reverseproxy.UpstreamPool) {
	return benchPoolLatency(b, n, sticky, "")
}

// benchPoolLatency is benchPool with the latency option given. Outside a
// reverse_proxy there is no transport to observe requests, which latency
// traffic and both require at Provision: for those the selector is made
// as Provision makes it, past that check.
func benchPoolLatency(b *testing.B, n int, sticky, latency string) (*HTTPPolicy, reverseproxy.UpstreamPool) {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: e2e.ClosingListener(b)}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	h := &HTTPPolicy{Config: Config{Name: fmt.Sprintf("bench-%d-%s-%s", n, sticky, latency), Sticky: sticky, Latency: latency, StickyMaxEntries: 1 << 21}}
	provision := h.Provision
	if latency == "traffic" || latency == "both" {
		provision = func(ctx caddy.Context) error { return h.provisionSelector(ctx, nil) }
	}
	if err := provision(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Cleanup() })
	req, _ := http.NewRequest("GET", "http://x/", nil)
	h.Select(pool, req, nil) // registers the upstreams as probe targets
	deadline := time.Now().Add(10 * time.Second)
	for {
		measured := 0
		for _, st := range h.policy.state.Tracker().Statuses() {
			if st.Measured {
				measured++
			}
		}
		if measured == n {
			return h, pool
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d upstreams measured", measured, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkSelect compares the policy's Select with Caddy's own random and
// least_conn on the same pool; make bench prints the ratios.
func BenchmarkSelect(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://app.example/", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	for _, n := range []int{4, 64} {
		h, pool := benchPool(b, n, "off")
		b.Run(fmt.Sprintf("anchor_random/upstreams=%d", n), func(b *testing.B) {
			p := reverseproxy.RandomSelection{}
			for b.Loop() {
				p.Select(pool, req, nil)
			}
		})
		b.Run(fmt.Sprintf("anchor_least_conn/upstreams=%d", n), func(b *testing.B) {
			p := reverseproxy.LeastConnSelection{}
			for b.Loop() {
				p.Select(pool, req, nil)
			}
		})
		b.Run(fmt.Sprintf("latency_bucket/upstreams=%d", n), func(b *testing.B) {
			for b.Loop() {
				if h.Select(pool, req, nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
		hs, pool2 := benchPool(b, n, "on")
		pinned := hs.Select(pool2, req, nil) // pins the one user
		b.Run(fmt.Sprintf("latency_bucket_sticky_hit/upstreams=%d", n), func(b *testing.B) {
			// Every pick must be the pinned publisher (a pointer compare):
			// a miss picks at random among n equally fast ones.
			for b.Loop() {
				if hs.Select(pool2, req, nil) != pinned {
					b.Fatal("not the pinned publisher")
				}
			}
		})
	}
}

// BenchmarkSelectLatencySource is Select with latency both against latency
// probe (the anchor), same pools, same run: a new pick without stickiness
// and a sticky hit, at 4 and 64 upstreams. With both, every upstream has
// observed traffic (fast answers, folded every 250 ms) and a sticky hit
// also checks that its publisher is still in the lowest bucket.
func BenchmarkSelectLatencySource(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://app.example/", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	for _, n := range []int{4, 64} {
		for _, sticky := range []string{"off", "on"} {
			kind := "new_pick"
			if sticky == "on" {
				kind = "sticky_hit"
			}
			for _, latency := range []string{"probe", "both"} {
				h, pool := benchPoolLatency(b, n, sticky, latency)
				tr := h.policy.state.Tracker()
				for _, u := range pool {
					for range 3 {
						tr.Observe(u.Dial, time.Millisecond, false)
					}
				}
				for deadline := time.Now().Add(5 * time.Second); latency == "both"; time.Sleep(10 * time.Millisecond) {
					if st := tr.Statuses(); st[0].ObservedSamples > 0 && st[len(st)-1].ObservedSamples > 0 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("observed traffic not folded")
					}
				}
				want := h.Select(pool, req, nil)
				name := latency
				if latency == "probe" {
					name = "anchor_probe"
				}
				b.Run(fmt.Sprintf("%s/%s/upstreams=%d", name, kind, n), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						u := h.Select(pool, req, nil)
						if u == nil || (sticky == "on" && u != want) {
							b.Fatal("no upstream, or not the pinned one")
						}
					}
				})
			}
		}
	}
}

// BenchmarkStickyHitAtOneMillion is a sticky hit through Select with 1M
// pairs in the table, cycling through 4096 distinct users.
func BenchmarkStickyHitAtOneMillion(b *testing.B) {
	h, pool := benchPool(b, 4, "on")
	reqs := make([]*http.Request, 4096)
	pinned := make([]*reverseproxy.Upstream, len(reqs))
	for i := range reqs {
		r, _ := http.NewRequest("GET", "http://app.example/", nil)
		r.RemoteAddr = fmt.Sprintf("192.0.2.%d:%d", i&255, 1024+i)
		pinned[i] = h.Select(pool, r, nil) // a real pick pins each of them
		reqs[i] = r
	}
	table, now := h.policy.table, h.policy.now()
	for i := range 1<<20 - len(reqs) {
		table.Put(table.Key(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), "app.example"), uint32(i%4), now)
	}
	if n := table.Len(); n < 1<<20-1<<14 {
		b.Fatalf("table holds %d pairs", n)
	}
	runtime.GC()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		// Every pick must be the user's pinned publisher: a miss picks at
		// random among 4 equally fast ones.
		if h.Select(pool, reqs[i%len(reqs)], nil) != pinned[i%len(reqs)] {
			b.Fatalf("user %d: not the pinned publisher", i%len(reqs))
		}
		i++
	}
}

// BenchmarkStickyStore compares, in one run, a sticky hit of today's
// policy (local table only) with a sticky hit of the same policy with a
// Redis sticky_store configured (a real local redis-server): a local hit
// must cost the same, with no Redis call. redis_level_hit is a local miss
// answered by Redis (GETEX), the pin then copied into the local table; it
// reports its p50 and p99 per pick.
func BenchmarkStickyStore(b *testing.B) {
	_, addr := e2e.StartRedis(b)
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	b.Cleanup(func() { client.Close() })
	h, pool := benchPool(b, 4, "on")
	req, _ := http.NewRequest("GET", "http://app.example/", nil)
	req.RemoteAddr = "192.0.2.1:1234"

	s := h.Config.settings()
	s.Tracker.OnRound = h.policy.onRound
	s.StickyStore = &pubsel.StickyStoreConfig{Store: redisStore{client}, Name: "redis bench", Prefix: "bench:latency_bucket:" + h.policy.name}
	if _, err := h.policy.state.Lease("bench-store", s); err != nil {
		b.Fatal(err)
	}
	shared := h.policy.state.StickyStore()
	withStore := *h
	withStore.selector = &pubsel.Selector[*reverseproxy.Upstream]{Tracker: h.policy.state.Tracker(),
		Holder: h.policy.lease.Holder(), Host: httpHost{}, Sticky: h.policy.table, StickyStore: shared}
	pinned := withStore.Select(pool, req, nil) // pins the user, locally and in Redis
	if pinned == nil {
		b.Fatal("no upstream")
	}
	calls := func() int64 {
		n, _ := client.Info(context.Background(), "stats").Result()
		for _, line := range strings.Split(n, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				return c
			}
		}
		return -1
	}
	b.Run("sticky_hit/anchor_local_only", func(b *testing.B) {
		for b.Loop() {
			if h.Select(pool, req, nil) != pinned {
				b.Fatal("not the pinned publisher")
			}
		}
	})
	b.Run("sticky_hit/store_configured", func(b *testing.B) {
		before, renewals := calls(), h.policy.state.StickyStoreStats().Refreshes.Load()
		for b.Loop() {
			if withStore.Select(pool, req, nil) != pinned {
				b.Fatal("not the pinned publisher")
			}
		}
		time.Sleep(10 * time.Millisecond) // a background renewal, if the run crossed a half-TTL epoch
		// INFO itself is one command; a renewal (at most one per half
		// hour) is one GETEX, off the pick's path.
		renewed := int64(h.policy.state.StickyStoreStats().Refreshes.Load() - renewals)
		if after := calls(); after-before != 1+renewed {
			b.Fatalf("%d Redis commands during %d local hits (%d background renewals)", after-before-1, b.N, renewed)
		}
	})
	b.Run("redis_level_hit", func(b *testing.B) {
		table, key := h.policy.table, h.policy.table.Key("192.0.2.1:1234", "app.example") // no client_ip var here: the remote address
		lat := make([]time.Duration, 0, 1<<16)
		hits := h.policy.state.StickyStoreStats().StoreHits.Load()
		for b.Loop() {
			table.Delete(key) // a local miss: another replica pinned the pair
			start := time.Now()
			u := withStore.Select(pool, req, nil)
			if len(lat) < cap(lat) {
				lat = append(lat, time.Since(start))
			}
			if u != pinned {
				b.Fatal("not the publisher pinned in Redis")
			}
		}
		if got := h.policy.state.StickyStoreStats().StoreHits.Load() - hits; got != uint64(b.N) {
			b.Fatalf("%d Redis hits for %d picks", got, b.N)
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	})
}

// nopTransport answers at once: the benchmark below measures the wrapper.
type nopTransport struct{ resp *http.Response }

func (n nopTransport) RoundTrip(*http.Request) (*http.Response, error) { return n.resp, nil }

// BenchmarkTrafficTransport is the request-path cost of the latency_bucket
// transport: the wrapped transport alone (anchor) against it wrapped, which
// adds two monotonic clock reads, the dial info lookup, the upstream's
// lookup and one lock-free record into its peak-EWMA (two atomic adds). Serial and parallel (one upstream: the worst
// case for contention on its figures).
func BenchmarkTrafficTransport(b *testing.B) {
	tr, err := pubsel.NewTracker(pubsel.Config{Source: pubsel.FromBoth})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 4 {
		if _, err := tr.Ensure(fmt.Sprintf("127.0.0.1:%d", 9001+i)); err != nil {
			b.Fatal(err)
		}
	}
	inner := nopTransport{&http.Response{StatusCode: 200}}
	wt := &TrafficTransport{Inner: innerOf(inner), target: new(atomic.Pointer[feedTarget])}
	wt.feed(tr, testClock)
	req, _ := http.NewRequest("GET", "http://app/", nil)
	req = req.WithContext(context.WithValue(req.Context(), caddy.CtxKey("reverse_proxy.dial_info"),
		reverseproxy.DialInfo{Network: "tcp", Address: "127.0.0.1:9002", Host: "127.0.0.1", Port: "9002"}))
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{{"anchor=wrapped transport alone", inner}, {"latency_bucket transport", wt}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.rt.RoundTrip(req)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.rt.RoundTrip(req)
				}
			})
		})
	}
}

// BenchmarkSelectP2C is a new pick (sticky off) with within p2c against
// Caddy's random (the anchor) and within random, same 4 upstreams, same
// run. The p2c pool is provisioned as a Caddyfile's within p2c is (orca on
// by default), with traffic observed on every upstream and requests in
// flight on two, so each pick reads two costs that differ; within_p2c has
// no ORCA report (the backends send none), within_p2c_orca a fresh report
// on every upstream, so each pick also scales both costs by their factors.
func BenchmarkSelectP2C(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://app.example/", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	h, pool := benchPool(b, 4, "off")
	hp, poolP := benchPoolP2C(b, "p2c", false)
	ho, poolO := benchPoolP2C(b, "p2c-orca", true)
	b.Run("anchor_random/upstreams=4", func(b *testing.B) {
		p := reverseproxy.RandomSelection{}
		for b.Loop() {
			p.Select(pool, req, nil)
		}
	})
	b.Run("within_random/upstreams=4", func(b *testing.B) {
		for b.Loop() {
			if h.Select(pool, req, nil) == nil {
				b.Fatal("no upstream")
			}
		}
	})
	for _, c := range []struct {
		name string
		h    *HTTPPolicy
		pool reverseproxy.UpstreamPool
	}{{"within_p2c", hp, poolP}, {"within_p2c_orca", ho, poolO}} {
		b.Run(c.name+"/upstreams=4", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if c.h.Select(c.pool, req, nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
	}
}

// benchPoolP2C provisions within p2c (as the Caddyfile would, past the
// transport check) over 4 loopback listeners, waits until they are
// measured, and gives each observed traffic and two of them a request in
// flight (for the rest of the benchmark); with reports, each also a fresh
// ORCA report (orca_blackout 0).
func benchPoolP2C(b *testing.B, name string, reports bool) (*HTTPPolicy, reverseproxy.UpstreamPool) {
	pool := make(reverseproxy.UpstreamPool, 4)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: e2e.ClosingListener(b)}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	h := &HTTPPolicy{Config: Config{Name: "bench-" + name, Within: "p2c", Sticky: "off"}}
	if reports {
		h.ORCABlackout = new(caddy.Duration)
	}
	if err := h.provisionSelector(ctx, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Cleanup() })
	req, _ := http.NewRequest("GET", "http://x/", nil)
	h.Select(pool, req, nil) // registers the upstreams as probe targets
	tr := h.policy.state.Tracker()
	for i, u := range pool {
		for range 3 {
			tr.Observe(u.Dial, time.Duration(i+1)*time.Millisecond, false)
		}
		if i < 2 {
			f := tr.Begin(u.Dial)
			b.Cleanup(f.Done)
		}
		if reports {
			f := tr.Begin(u.Dial)
			if why := tr.ReportLoad(f, fmt.Sprintf("TEXT cpu_utilization=0.%d", i+2), false, h.policy.now()); why != 0 {
				b.Fatalf("report: %v", why)
			}
			f.Done()
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		measured, observed := 0, 0
		for _, st := range tr.Statuses() {
			if st.Measured {
				measured++
			}
			if st.ObservedSamples > 0 {
				observed++
			}
		}
		if measured == 4 && observed == 4 {
			return h, pool
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of 4 measured, %d with observed traffic", measured, observed)
		}
	}
}

// BenchmarkSelectP2CInterleaved runs the picks of BenchmarkSelectP2C in
// turn, in blocks of 1,000 picks each (about 50 µs), and reports the median
// over blocks of each pick's time per op and of its ratio to Caddy's random
// in the same block: a busy host's load changes over milliseconds, so
// sub-benchmarks run one after the other (each for a second) compare
// different loads, while neighbouring blocks share theirs.
func BenchmarkSelectP2CInterleaved(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://app.example/", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	h, pool := benchPool(b, 4, "off")
	hp, poolP := benchPoolP2C(b, "p2c-interleaved", false)
	ho, poolO := benchPoolP2C(b, "p2c-orca-interleaved", true)
	anchor := reverseproxy.RandomSelection{}
	picks := []struct {
		name string
		pick func()
	}{
		{"anchor_random", func() { anchor.Select(pool, req, nil) }},
		{"within_random", func() { h.Select(pool, req, nil) }},
		{"within_p2c", func() { hp.Select(poolP, req, nil) }},
		{"within_p2c_orca", func() { ho.Select(poolO, req, nil) }},
	}
	const block = 1000
	per := make([][]float64, len(picks))
	b.ResetTimer()
	for n := 0; n < b.N; n += block * len(picks) {
		for k, p := range picks {
			start := time.Now()
			for range block {
				p.pick()
			}
			per[k] = append(per[k], float64(time.Since(start))/block)
		}
	}
	b.StopTimer()
	median := func(x []float64) float64 {
		x = slices.Clone(x)
		slices.Sort(x)
		return x[len(x)/2]
	}
	for k, p := range picks {
		ratios := make([]float64, len(per[k]))
		for i := range ratios {
			ratios[i] = per[k][i] / per[0][i]
		}
		b.ReportMetric(median(per[k]), p.name+"-ns/op")
		if k > 0 {
			b.ReportMetric(median(ratios), p.name+"/random")
		}
	}
}
