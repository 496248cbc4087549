package latencybucket

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/pubsel"
	"github.com/edgesteer/edgesteer/internal/sticky"
)

// policy is one config generation's use of a latency_bucket state: the
// lease on the pooled state (shared with the HTTP or layer4 selector of the
// same name in other generations), metrics and logging.
type policy struct {
	name        string
	kind        string
	key         stateKey
	state       *pooledState
	pooled      bool // holds a reference in states
	lease       *pubsel.Lease
	table       *sticky.Table       // nil with sticky off
	stickyStore *pubsel.StickyStore // nil without sticky_store
	picks       *pubsel.Picks       // the name's, for the process (picksOf)
	logger      *zap.Logger
	metrics     *metrics
}

// provision validates c, adopts (or makes) the state named by the policy's
// name, applies c to it, and holds the static upstreams found in the parent
// proxy handler's config.
func (p *policy) provision(ctx caddy.Context, c *Config, kind string, dials []string) error {
	if err := c.Validate(kind == "layer4"); err != nil {
		return err
	}
	p.kind, p.logger = kind, ctx.Logger()
	var err error
	if p.metrics, err = registerMetrics(ctx); err != nil {
		return err
	}
	addrs := probeAddrs(dials)
	if err := c.checkUDPUpstreams(addrs); err != nil {
		return err
	}
	p.name = c.Name
	if p.name == "" {
		p.name = defaultName(kind, addrs, c)
	}
	s, err := p.engineSettings(ctx, c)
	if err != nil {
		return err
	}
	if err := p.nameFree(); err != nil {
		return err
	}
	adopted, err := p.adopt(s, c)
	if err != nil {
		return err
	}
	if err := p.hold(ctx, s, addrs); err != nil {
		return err
	}
	p.logProvisioned(adopted, addrs, s)
	return nil
}

// engineSettings is the state's settings c asks for, with the policy's
// hooks: probe rounds, and the shared sticky store's health and refusals
// (a store only with sticky on). ORCA is HTTP's alone: layer 4 answers
// carry no header.
func (p *policy) engineSettings(ctx caddy.Context, c *Config) (pubsel.Settings, error) {
	s := c.settings()
	s.Tracker.OnRound = p.onRound
	s.Tracker.ORCA = s.Tracker.ORCA && p.kind == "http"
	if !s.Sticky {
		return s, nil
	}
	var err error
	if s.StickyStore, err = c.stickyStoreConfig(ctx, p.name); err != nil {
		return s, err
	}
	if s.StickyStore != nil {
		s.StickyStore.OnHealth = p.onStoreHealth
		s.StickyStore.OnRefusal = p.onStoreRefusal
	}
	return s, nil
}

// nameFree fails if a policy of the other kind holds the policy's name:
// metrics and the admin view label a state by name alone.
func (p *policy) nameFree() error {
	other := stateKey{"layer4", p.name}
	if p.kind == "layer4" {
		other.kind = "http"
	}
	if _, used := states.References(other); used {
		article := map[string]string{"http": "an HTTP", "layer4": "a layer4"}[other.kind]
		return fmt.Errorf("latency_bucket: name %q is already used by %s policy; give each its own name", p.name, article)
	}
	return nil
}

// adopt takes a reference on the pooled state of the policy's name, made
// with settings s if no generation holds it, and reports whether it was
// adopted. The name's pick counts and c's pick rule (for the admin view)
// come with it.
func (p *policy) adopt(s pubsel.Settings, c *Config) (adopted bool, err error) {
	key := stateKey{p.kind, p.name}
	v, adopted, err := states.LoadOrNew(key, func() (caddy.Destructor, error) {
		st, err := pubsel.NewState(s)
		if err != nil {
			return nil, err
		}
		return &pooledState{State: st, key: key}, nil
	})
	if err != nil {
		return false, fmt.Errorf("latency_bucket: %v", err)
	}
	p.key, p.state, p.pooled = key, v.(*pooledState), true
	p.picks = picksOf(p.name)
	p.state.picking.Store(&picking{within: c.Within, slowStart: time.Duration(c.SlowStart)})
	return adopted, nil
}

// hold leases the state for this config generation, which puts s in
// force, and holds the static upstreams addrs; with sticky on, the
// policy then uses the state's table and shared store.
func (p *policy) hold(ctx caddy.Context, s pubsel.Settings, addrs []string) error {
	var err error
	// The generation's context identifies it: two policies of one config
	// sharing a name must agree on the settings.
	if p.lease, err = p.state.Lease(ctx.Done(), s); err != nil {
		if err == pubsel.ErrConflict {
			return fmt.Errorf("latency_bucket: name %q is used by two policies with different settings", p.name)
		}
		return fmt.Errorf("latency_bucket: %v", err)
	}
	for _, a := range addrs {
		if _, err := p.lease.Ensure(a); err != nil {
			return fmt.Errorf("latency_bucket: upstream %s: %v", a, err)
		}
	}
	if s.Sticky {
		p.table = p.state.Table()
		p.stickyStore = p.state.StickyStore()
	}
	return nil
}

// logProvisioned says which state the policy took and what it probes.
func (p *policy) logProvisioned(adopted bool, addrs []string, s pubsel.Settings) {
	p.logger.Info("latency_bucket policy provisioned",
		zap.String("policy", p.name), zap.Bool("adopted", adopted), zap.Time("state_since", p.state.Since()),
		zap.Strings("probing", addrs), zap.Duration("bucket_width", p.state.Tracker().Config().BucketWidth),
		zap.Bool("latency_off", s.Tracker.NoBuckets), zap.Bool("sticky", s.Sticky), zap.Bool("sticky_store", p.stickyStore != nil))
}

// cleanup gives back this generation's lease and pool reference; the state
// itself stops only when no generation holds it. Caddy cleans up the old
// generation without waiting for its last requests and connections, so the
// state stays reachable for their picks (from a stopped tracker, if it was
// the last user).
func (p *policy) cleanup() {
	if p.lease != nil {
		p.lease.Release()
	}
	if p.pooled {
		p.pooled = false
		if _, err := states.Delete(p.key); err != nil {
			p.logger.Error("releasing latency_bucket state", zap.String("policy", p.name), zap.Error(err))
		}
	}
}

// now is the state's coarse clock, for the sticky table.
func (p *policy) now() int64 { return p.state.Now() }

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

// onStoreHealth logs the shared sticky store going down and coming back.
func (p *policy) onStoreHealth(healthy bool, err error) {
	if healthy {
		p.logger.Info("sticky store is back: local misses read it again", zap.String("policy", p.name))
		return
	}
	reason, _ := pubsel.Trouble(err)
	p.logger.Warn("sticky store unreachable: picking locally until it answers again",
		zap.String("policy", p.name), zap.String("reason", reason), zap.Error(err))
}

// onStoreRefusal logs the shared sticky store starting to refuse keys
// (error replies: those pairs are pinned locally) and, once it has refused
// none for a while, the end of it.
func (p *policy) onStoreRefusal(refusing bool, reason, key string, err error) {
	if !refusing {
		p.logger.Info("sticky store accepts keys again", zap.String("policy", p.name))
		return
	}
	p.logger.Warn("sticky store refuses keys: their pairs are pinned locally",
		zap.String("policy", p.name), zap.String("reason", reason), zap.String("key", key), zap.Error(err))
}

// probeAddrs turns dial addresses into probe targets, host:port or, for
// UDP, udp/host:port, leaving out what cannot be probed: placeholders,
// unix sockets, port ranges.
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
	if err != nil || na.IsUnixNetwork() || na.PortRangeSize() != 1 {
		return ""
	}
	hp := net.JoinHostPort(na.Host, fmt.Sprint(na.StartPort))
	switch {
	case strings.HasPrefix(na.Network, "tcp"):
		return hp
	case strings.HasPrefix(na.Network, "udp"):
		return latency.UDPPrefix + hp
	}
	return ""
}

// defaultName names a policy without a name: its kind, its upstreams and a
// hash of its upstreams and settings. Two policies get the same default
// name only if they probe the same upstreams the same way, so sharing state
// is then harmless; a reload that changes neither keeps the state, one that
// changes either starts afresh (set name to keep state across such changes).
func defaultName(kind string, addrs []string, c *Config) string {
	sorted := slices.Sorted(slices.Values(addrs))
	h := fnv.New32a()
	json.NewEncoder(h).Encode(struct {
		Upstreams []string
		Config    *Config
	}{sorted, c})
	sum := fmt.Sprintf("%08x", h.Sum32())
	switch len(sorted) {
	case 0:
		return kind + ":dynamic~" + sum
	case 1:
		return kind + ":" + sorted[0] + "~" + sum
	}
	return fmt.Sprintf("%s:%s+%d~%s", kind, sorted[0], len(sorted)-1, sum)
}
