package latencybucket

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/pubsel"
	"github.com/edgesteer/edgesteer/internal/sticky"
)

// policy is the runtime shared by the HTTP and layer4 modules: one tracker
// probing the upstreams, one sticky table, registration with the admin API
// and metrics.
type policy struct {
	name    string
	kind    string // "http" or "layer4"
	tracker *pubsel.Tracker
	table   *sticky.Table // nil with sticky off
	logger  *zap.Logger
	metrics *metrics
	done    chan struct{}

	// clock is a coarse unix-nanosecond clock for the sticky table, which
	// counts in seconds: reading it is cheaper than time.Now per request.
	clock atomic.Int64
	// counters caches selection counters by target, bucket and decision
	// (copy on write): resolving label values per request would cost more
	// than the pick itself.
	counters   atomic.Pointer[map[uint64]prometheus.Counter]
	countersMu sync.Mutex
}

// provision validates c, starts probing the static upstreams found in the
// parent proxy handler's config, and registers the policy.
func (p *policy) provision(ctx caddy.Context, c *Config, kind string, dials []string) error {
	if err := c.Validate(kind == "layer4"); err != nil {
		return err
	}
	p.kind = kind
	p.logger = ctx.Logger()
	m, err := registerMetrics(ctx)
	if err != nil {
		return err
	}
	p.metrics = m

	addrs := probeAddrs(dials)
	p.name = c.Name
	if p.name == "" {
		p.name = defaultName(kind, addrs)
	}
	cfg := c.trackerConfig()
	cfg.OnRound = p.onRound
	if p.tracker, err = pubsel.NewTracker(cfg); err != nil {
		return fmt.Errorf("latency_bucket: %v", err)
	}
	for _, a := range addrs {
		if _, err := p.tracker.Ensure(a); err != nil {
			return fmt.Errorf("latency_bucket: upstream %s: %v", a, err)
		}
	}
	if c.Sticky != "off" {
		ttl, max := time.Duration(c.StickyTTL), c.StickyMaxEntries
		if ttl == 0 {
			ttl = defaultStickyTTL
		}
		if max == 0 {
			max = defaultStickyMaxEntries
		}
		p.table = sticky.New(max, ttl)
	}
	p.done = make(chan struct{})
	p.clock.Store(time.Now().UnixNano())
	p.tracker.Start()
	go p.tick()
	registry.Add(p)
	p.logger.Info("latency_bucket policy provisioned",
		zap.String("policy", p.name), zap.Strings("probing", addrs),
		zap.Duration("bucket_width", cfg.BucketWidth), zap.Bool("latency_off", cfg.NoBuckets),
		zap.Bool("sticky", p.table != nil))
	return nil
}

func (p *policy) cleanup() {
	registry.Remove(p)
	if p.done != nil {
		close(p.done)
	}
	if p.tracker != nil {
		p.tracker.Stop()
	}
}

// tick advances the coarse clock and, once a minute, drops idle sticky
// entries.
func (p *policy) tick() {
	if p.table == nil {
		return
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-p.done:
			return
		case now := <-tick.C:
			p.clock.Store(now.UnixNano())
			if now.Sub(lastSweep) >= time.Minute {
				p.table.Sweep(now.UnixNano())
				lastSweep = now
			}
		}
	}
}

// now is the coarse clock, for the sticky table.
func (p *policy) now() int64 { return p.clock.Load() }

func (p *policy) onRound(addr string, r latency.Result) {
	p.metrics.observeRound(p.name, addr, r)
	if r.OK == 0 {
		p.logger.Warn("publisher probe round failed",
			zap.String("policy", p.name), zap.String("publisher", addr), zap.Error(r.Err))
		return
	}
	p.logger.Debug("publisher probed", zap.String("policy", p.name), zap.String("publisher", addr),
		zap.Durations("rtts", r.RTTs), zap.Duration("best", r.Best))
}

// selected records a decision in the metrics.
func (p *policy) selected(d pubsel.Decision) {
	st := d.Status
	if st == nil {
		return
	}
	key := uint64(st.ID)<<33 | uint64(uint32(st.Bucket))<<1
	if d.Sticky {
		key |= 1
	}
	if m := p.counters.Load(); m != nil {
		if c, ok := (*m)[key]; ok {
			c.Inc()
			return
		}
	}
	p.countersMu.Lock()
	old := p.counters.Load()
	m := make(map[uint64]prometheus.Counter, 1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	c := p.metrics.selections.WithLabelValues(p.name, st.Addr, st.Label, stickyLabel(d.Sticky))
	m[key] = c
	p.counters.Store(&m)
	p.countersMu.Unlock()
	c.Inc()
}

func stickyLabel(b bool) string {
	if b {
		return "sticky"
	}
	return "new"
}

// probeAddrs turns dial addresses into host:port probe targets, leaving out
// what cannot be probed: placeholders, unix sockets, udp.
func probeAddrs(dials []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range dials {
		if a := probeAddr(d); a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

func probeAddr(dial string) string {
	if strings.Contains(dial, "{") {
		return ""
	}
	na, err := caddy.ParseNetworkAddress(dial)
	if err != nil || na.IsUnixNetwork() || na.PortRangeSize() != 1 || !strings.HasPrefix(na.Network, "tcp") {
		return ""
	}
	return net.JoinHostPort(na.Host, fmt.Sprint(na.StartPort))
}

func defaultName(kind string, addrs []string) string {
	switch len(addrs) {
	case 0:
		return kind + ":dynamic"
	case 1:
		return kind + ":" + addrs[0]
	}
	return fmt.Sprintf("%s:%s+%d", kind, addrs[0], len(addrs)-1)
}
