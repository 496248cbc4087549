package ntier

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	engine "github.com/edgesteer/edgesteer/internal/ntier"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

func init() { caddy.RegisterModule(App{}) }

// AppName is the app's module ID and Caddyfile global option.
const AppName = "ntier"

// App is transparent N-tier cache redirection's control plane: on the upper
// tier it installs the kernel rules that forward each client's packets to
// a lower node by next hop and health-checks the nodes; on a lower node it
// installs the tproxy rules that hand intercepted connections to a `bind
// tproxy/…` listener. The rules stay across reloads (the state is kept in
// a pool by role) and are removed when the app stops for good.
type App struct {
	Upper *Upper `json:"upper,omitempty"`
	Lower *Lower `json:"lower,omitempty"`

	upper  engine.Config
	lower  engine.RuleSet
	logger *zap.Logger
	keys   []string
}

// Upper configures this host as the upper tier.
type Upper struct {
	// TierMapFile (or TierMap inline) lists the lower nodes, in bucket
	// order, each with its next_hop (and optional health address).
	TierMapFile string        `json:"tier_map_file,omitempty"`
	TierMap     *srcports.Map `json:"tier_map,omitempty"`
	// Ports are the intercepted TCP destination ports ("80", "8000-8099").
	Ports      []string `json:"ports"`
	Interfaces []string `json:"interfaces,omitempty"`
	// HealthPort: a node without a health address is checked on its
	// next hop at this port (default 80).
	HealthPort     int            `json:"health_port,omitempty"`
	HealthInterval caddy.Duration `json:"health_interval,omitempty"`
	HealthTimeout  caddy.Duration `json:"health_timeout,omitempty"`
	Fall           int            `json:"fall,omitempty"`
	Rise           int            `json:"rise,omitempty"`
	Buckets        int            `json:"buckets,omitempty"`
	Seed           uint32         `json:"seed,omitempty"`
	TableBase      int            `json:"table_base,omitempty"`
	RulePriority   int            `json:"rule_priority,omitempty"`
	Table          string         `json:"table,omitempty"`
}

// Lower configures this host as a lower node.
type Lower struct {
	Ports        []string `json:"ports"`
	Interfaces   []string `json:"interfaces,omitempty"`
	ListenPort   int      `json:"listen_port"`
	Mark         uint32   `json:"mark,omitempty"`
	RulePriority int      `json:"rule_priority,omitempty"`
	Table        string   `json:"table,omitempty"`
	// IPVersions are the families intercepted: 4, 6 or both (default).
	IPVersions []int `json:"ip_versions,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: AppName, New: func() caddy.Module { return new(App) }}
}

// Provision builds and checks the rule sets; nothing touches the kernel
// before Start, so `caddy validate` needs no privilege.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if err := metricsreg.Register(ctx, collector{}); err != nil {
		return err
	}
	if a.Upper == nil && a.Lower == nil {
		return fmt.Errorf("%s: give upper or lower (or both)", AppName)
	}
	if a.Upper != nil {
		cfg, err := a.Upper.config()
		if err != nil {
			return fmt.Errorf("%s upper: %w", AppName, err)
		}
		a.upper = cfg
	}
	if a.Lower != nil {
		ports, err := parsePorts(a.Lower.Ports)
		if err != nil {
			return fmt.Errorf("%s lower: %w", AppName, err)
		}
		if a.Lower.ListenPort < 1 || a.Lower.ListenPort > 65535 {
			return fmt.Errorf("%s lower: listen_port %d: want the tproxy listener's port", AppName, a.Lower.ListenPort)
		}
		rs, err := engine.TproxyRules(engine.TproxyConfig{Ports: ports, Interfaces: a.Lower.Interfaces,
			ListenPort: uint16(a.Lower.ListenPort), Mark: a.Lower.Mark, RulePriority: a.Lower.RulePriority, Table: a.Lower.Table,
			IPVersions: a.Lower.IPVersions})
		if err != nil {
			return fmt.Errorf("%s lower: %w", AppName, err)
		}
		a.lower = rs
	}
	return nil
}

func (u *Upper) config() (engine.Config, error) {
	var m *srcports.Map
	switch {
	case u.TierMapFile != "" && u.TierMap != nil:
		return engine.Config{}, fmt.Errorf("give tier_map_file or tier_map, not both")
	case u.TierMapFile != "":
		var err error
		if m, err = srcports.Load(u.TierMapFile); err != nil {
			return engine.Config{}, err
		}
	case u.TierMap != nil:
		if err := u.TierMap.Resolve(); err != nil {
			return engine.Config{}, fmt.Errorf("tier_map: %w", err)
		}
		m = u.TierMap
	default:
		return engine.Config{}, fmt.Errorf("tier_map_file (or tier_map) is required")
	}
	ports, err := parsePorts(u.Ports)
	if err != nil {
		return engine.Config{}, err
	}
	healthPort := u.HealthPort
	if healthPort == 0 {
		healthPort = 80
	}
	if healthPort < 1 || healthPort > 65535 {
		return engine.Config{}, fmt.Errorf("health_port %d: not a port", u.HealthPort)
	}
	cfg := engine.Config{
		Ports: ports, Interfaces: u.Interfaces, Buckets: u.Buckets, Seed: u.Seed, TableBase: u.TableBase,
		RulePriority: u.RulePriority, Table: u.Table,
		Health: engine.Health{Interval: time.Duration(u.HealthInterval), Timeout: time.Duration(u.HealthTimeout), Fall: u.Fall, Rise: u.Rise},
	}
	for _, n := range m.Nodes {
		node, err := nodeOf(n, healthPort)
		if err != nil {
			return engine.Config{}, err
		}
		cfg.Nodes = append(cfg.Nodes, node)
	}
	cfg = cfg.WithDefaults()
	return cfg, cfg.Validate()
}

// nodeOf reads a tier map node's next hops: next_hop of either family,
// next_hop6 an IPv6 one beside an IPv4 next_hop.
func nodeOf(n srcports.Node, healthPort int) (engine.Node, error) {
	node := engine.Node{Name: n.Name, Health: n.Health}
	for _, hop := range []struct{ opt, val string }{{"next_hop", n.NextHop}, {"next_hop6", n.NextHop6}} {
		if hop.val == "" {
			continue
		}
		a, err := netip.ParseAddr(hop.val)
		if err != nil {
			return node, fmt.Errorf("node %q: %s %q: not an address", n.Name, hop.opt, hop.val)
		}
		switch v4 := a.Is4() || a.Is4In6(); {
		case v4 && hop.opt == "next_hop6":
			return node, fmt.Errorf("node %q: next_hop6 %s: not an IPv6 address", n.Name, a)
		case v4:
			node.NextHop = a.Unmap()
		case node.NextHop6.IsValid():
			return node, fmt.Errorf("node %q: next_hop %s and next_hop6 %s: two IPv6 next hops", n.Name, node.NextHop6, a)
		default:
			node.NextHop6 = a
		}
	}
	if node.Health == "" {
		if hop := node.NextHop; hop.IsValid() {
			node.Health = netip.AddrPortFrom(hop, uint16(healthPort)).String()
		} else if hop := node.NextHop6; hop.IsValid() {
			node.Health = netip.AddrPortFrom(hop, uint16(healthPort)).String()
		}
	}
	return node, nil
}

func parsePorts(in []string) ([]srcports.Range, error) {
	out := make([]srcports.Range, 0, len(in))
	for _, s := range in {
		r, err := srcports.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("ports: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// pool keeps the installed state by role ("upper", "lower") across
// reloads: a new generation takes a reference in Start and the old one
// gives its reference back in Stop; the last one out removes the rules.
var pool = caddy.NewUsagePool()

// upperState is the running upper tier: its controller and probe loop.
type upperState struct {
	ctl    *engine.Controller
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *upperState) Destruct() error {
	s.cancel()
	<-s.done
	return s.ctl.Remove()
}

// lowerState is a lower node's installed tproxy rule set.
type lowerState struct {
	mu     sync.Mutex
	kernel engine.Kernel
	rs     engine.RuleSet
}

func (s *lowerState) Destruct() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kernel.Remove(s.rs)
}

// kernel is the backend the app installs with; tests of the adapter may
// replace it. EDGESTEER_TEST_KERNEL_WITHOUT_TPROXY=1 is a test hook (see
// engine.NetlinkKernel.WithoutTproxy): the kernel then refuses the lower
// node's rules as one without tproxy does.
var kernel engine.Kernel = engine.NetlinkKernel{WithoutTproxy: os.Getenv("EDGESTEER_TEST_KERNEL_WITHOUT_TPROXY") == "1"}

// Start installs the rules (or, after a reload, applies the new
// configuration to the kept state). Missing privileges and kernel
// features fail here, with nothing left installed.
func (a *App) Start() error {
	if a.Upper != nil {
		if err := a.startUpper(); err != nil {
			a.Stop()
			return fmt.Errorf("%s upper: %w", AppName, err)
		}
	}
	if a.Lower != nil {
		if err := a.startLower(); err != nil {
			a.Stop()
			return fmt.Errorf("%s lower: %w", AppName, err)
		}
	}
	return nil
}

func (a *App) startUpper() error {
	logger := a.logger
	v, loaded, err := pool.LoadOrNew("upper", func() (caddy.Destructor, error) {
		ctl, err := engine.New(a.upper, kernel, engine.TCPProber{}, nil)
		if err != nil {
			return nil, err
		}
		if err := ctl.Apply(); err != nil {
			return nil, err
		}
		ctl.OnChange(func(node string, up bool, lastErr string) {
			if up {
				logger.Info("lower node up: its buckets return to it", zap.String("node", node))
			} else {
				logger.Warn("lower node down: its buckets move to the others", zap.String("node", node), zap.String("error", lastErr))
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		s := &upperState{ctl: ctl, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(s.done)
			ctl.Run(ctx, func(err error) { logger.Error("applying the rules after a health change", zap.Error(err)) })
		}()
		return s, nil
	})
	if err != nil {
		return err
	}
	a.keys = append(a.keys, "upper")
	if loaded {
		return v.(*upperState).ctl.Reconfigure(a.upper)
	}
	return nil
}

func (a *App) startLower() error {
	v, loaded, err := pool.LoadOrNew("lower", func() (caddy.Destructor, error) {
		if err := kernel.Apply(a.lower); err != nil {
			return nil, err
		}
		return &lowerState{kernel: kernel, rs: a.lower}, nil
	})
	if err != nil {
		return err
	}
	a.keys = append(a.keys, "lower")
	if !loaded {
		return nil
	}
	s := v.(*lowerState)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rs.Equal(a.lower) {
		return nil
	}
	if s.rs.Table != a.lower.Table || s.rs.RulePriority != a.lower.RulePriority {
		if err := s.kernel.Remove(s.rs); err != nil {
			return err
		}
	}
	if err := s.kernel.Apply(a.lower); err != nil {
		return err
	}
	s.rs = a.lower
	return nil
}

// Stop gives back this generation's references; the last one removes the
// rules it holds.
func (a *App) Stop() error {
	var first error
	for _, k := range a.keys {
		if _, err := pool.Delete(k); err != nil && first == nil {
			first = err
		}
	}
	a.keys = nil
	return first
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
)
