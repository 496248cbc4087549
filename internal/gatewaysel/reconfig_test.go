package gatewaysel

import (
	"context"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// What a reload keeps of a location probed before it, per kind of change.
func TestReconfigureRules(t *testing.T) {
	gws := exampleGateways() // RTTs gw1 302, gw2 132, gw3 506, gw4 877
	without := func(name string) []gatewayorder.Gateway {
		return slices.DeleteFunc(exampleGateways(), func(g gatewayorder.Gateway) bool { return g.Name == name })
	}
	for _, tc := range []struct {
		name      string
		change    func(c *Config)
		wantSrc   Source // of the next query
		wantOrder []string
		expired   bool
	}{
		{"same config", func(c *Config) {}, Cached, []string{"gw2", "gw1", "gw3", "gw4"}, false},
		{"ttl and deadline", func(c *Config) { c.Deadline = time.Second; c.Retry = time.Hour }, Cached, []string{"gw2", "gw1", "gw3", "gw4"}, false},
		{"gateway removed", func(c *Config) { c.Gateways = without("gw1") }, Cached, []string{"gw2", "gw3", "gw4"}, false},
		{"optimal removed", func(c *Config) { c.Gateways = without("gw2") }, Cached, []string{"gw1", "gw3", "gw4"}, false},
		{"backups changed", func(c *Config) { c.Gateways[1].Backups = []string{"gw4"} }, Cached, []string{"gw2", "gw4", "gw1", "gw3"}, false},
		{"gateway added", func(c *Config) {
			c.Gateways = append(c.Gateways, gatewayorder.Gateway{Name: "gw5", Addr: "e:1"})
		}, Probed, []string{"gw5", "gw2", "gw1", "gw3", "gw4"}, true},
		{"gateway readdressed", func(c *Config) { c.Gateways[0].Addr = "e:1" }, Probed, []string{"gw1", "gw2", "gw3", "gw4"}, true},
		{"probe changed", func(c *Config) { c.ProbeID = "tls" }, Probed, []string{"gw2", "gw1", "gw3", "gw4"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := exampleProber()
			p.rtts["e:1"] = 50 * ms
			s := newSel(t, Config{Gateways: gws, Prober: p, ProbeID: "https"})
			s.Select(context.Background(), "loc")
			calls := p.calls.Load()
			cfg := Config{Gateways: exampleGateways(), Prober: p, ProbeID: "https"}
			tc.change(&cfg)
			ch, err := s.Reconfigure(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Invalidates() != tc.expired || (tc.expired && ch.Expired != 1) {
				t.Fatalf("change %+v, want expired=%v", ch, tc.expired)
			}
			res, src := pick(s.Select(context.Background(), "loc"))
			if src != tc.wantSrc || !slices.Equal(res.Names(), tc.wantOrder) {
				t.Fatalf("%v %v, want %v %v", src, res.Names(), tc.wantSrc, tc.wantOrder)
			}
			if (p.calls.Load() != calls) != (tc.wantSrc == Probed) {
				t.Fatalf("%d probes after the change", p.calls.Load()-calls)
			}
		})
	}
}

// A stale result is the previous selection while the new run is silent.
func TestReconfigureStaleIsPrevious(t *testing.T) {
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: 100 * ms})
	s.Select(context.Background(), "loc")
	p.block.Store(true)
	cfg := Config{Gateways: append(exampleGateways(), gatewayorder.Gateway{Name: "gw5", Addr: "e:1"}), Prober: p, Deadline: 100 * ms}
	if _, err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	res, src := pick(s.Select(context.Background(), "loc"))
	if src != Previous || !slices.Equal(res.Names(), []string{"gw2", "gw1", "gw3", "gw4", "gw5"}) {
		t.Fatalf("%v %v", src, res.Names())
	}
}

// A run in flight across a reload stores its result mapped onto the new
// gateways, and queries after the reload wait for it instead of probing.
func TestReconfigureDuringRun(t *testing.T) {
	p := &gatedProber{fakeProber: exampleProber(), gate: make(chan struct{})}
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: 5 * time.Second})
	got := make(chan *gatewayorder.Result, 2)
	go func() { res, _ := pick(s.Select(context.Background(), "loc")); got <- res }()
	for p.waiting.Load() < 4 { // every gateway's first probe has started
		time.Sleep(ms)
	}
	cfg := Config{Gateways: exampleGateways()[1:], Prober: p, Deadline: 5 * time.Second} // gw1 removed
	if _, err := s.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	go func() { res, _ := pick(s.Select(context.Background(), "loc")); got <- res }()
	time.Sleep(20 * ms) // give the second query time to (wrongly) start a run
	close(p.gate)
	for range 2 {
		res := <-got
		if res == nil {
			t.Fatal("no result")
		}
	}
	s.mu.Lock()
	res := s.entries["loc"].res
	s.mu.Unlock()
	if res == nil || !slices.Equal(res.Names(), []string{"gw2", "gw3", "gw4"}) {
		t.Fatalf("stored %v", res)
	}
	if n := p.calls.Load(); n != 12 {
		t.Fatalf("%d probes, want the one run's 12", n)
	}
}

// gatedProber holds every probe until gate closes.
type gatedProber struct {
	*fakeProber
	gate    chan struct{}
	waiting atomic.Int64
}

func (p *gatedProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	p.waiting.Add(1)
	select {
	case <-p.gate:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return p.fakeProber.Probe(ctx, addr)
}

func TestPoolAdoptsAndClosesOnLastRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ogs.json")
	pool := NewPool()
	p := exampleProber()
	cfg := Config{Gateways: exampleGateways(), Prober: p, CacheFile: path}
	a, err := pool.Acquire("blk", cfg)
	if err != nil || a.Adopted {
		t.Fatalf("%+v %v", a, err)
	}
	a.Table().Select(context.Background(), "loc")
	calls := p.calls.Load()
	// A reload: the new configuration acquires before the old releases.
	mark := pool.Mark()
	b, err := pool.Acquire("blk", cfg)
	if err != nil || !b.Adopted || b.Table() != a.Table() {
		t.Fatalf("not adopted: %+v %v", b, err)
	}
	otherCfg := cfg
	otherCfg.CacheFile = path + ".other"
	other, _ := pool.Acquire("other", otherCfg)
	if other.Table() == a.Table() {
		t.Fatal("two names share a selector")
	}
	a.Release()
	a.Release() // twice is harmless
	if _, src := pick(b.Table().Select(context.Background(), "loc")); src != Cached || p.calls.Load() != calls {
		t.Fatalf("after the old lease went: %v", src)
	}
	// A failed reload rolls back the leases taken after the mark.
	pool.ReleaseSince(mark)
	if pool.Leases("blk") != 0 || pool.Leases("other") != 0 {
		t.Fatalf("leases left: %d %d", pool.Leases("blk"), pool.Leases("other"))
	}
	// The last release closed it and saved the file: a new one loads it.
	c, _ := pool.Acquire("blk", cfg)
	defer c.Release()
	if c.Adopted || c.Loaded != 1 {
		t.Fatalf("after the last release: %+v", c)
	}
}
