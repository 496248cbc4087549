package latencybucket

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// benchPool provisions an HTTPPolicy over n real loopback listeners and
// waits until every one is measured (all land in [0,32)).
func benchPool(b *testing.B, n int, sticky string) (*HTTPPolicy, reverseproxy.UpstreamPool) {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: e2e.ClosingListener(b)}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	h := &HTTPPolicy{Config: Config{Name: fmt.Sprintf("bench-%d-%s", n, sticky), Sticky: sticky, StickyMaxEntries: 1 << 21}}
	if err := h.Provision(ctx); err != nil {
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
		hs.Select(pool2, req, nil) // pins the one user
		b.Run(fmt.Sprintf("latency_bucket_sticky_hit/upstreams=%d", n), func(b *testing.B) {
			for b.Loop() {
				hs.Select(pool2, req, nil)
			}
		})
	}
}

// BenchmarkStickyHitAtOneMillion is a sticky hit through Select with 1M
// pairs in the table, cycling through 4096 distinct users.
func BenchmarkStickyHitAtOneMillion(b *testing.B) {
	h, pool := benchPool(b, 4, "on")
	reqs := make([]*http.Request, 4096)
	for i := range reqs {
		r, _ := http.NewRequest("GET", "http://app.example/", nil)
		r.RemoteAddr = fmt.Sprintf("192.0.2.%d:%d", i&255, 1024+i)
		h.Select(pool, r, nil) // a real pick pins each of them
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
		h.Select(pool, reqs[i%len(reqs)], nil)
		i++
	}
}
