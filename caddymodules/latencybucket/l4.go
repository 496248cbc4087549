package latencybucket

import (
	"net"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"
	"github.com/mholt/caddy-l4/modules/l4proxy"

	"github.com/edgesteer/edgesteer/internal/pubsel"
)

func init() {
	caddy.RegisterModule(L4Policy{})
}

// L4Policy is the latency_bucket selection policy of caddy-l4's proxy.
//
// It sets the placeholders {l4.proxy.latency_bucket.publisher},
// {…latency_ms}, {…bucket}, {…decision} ("new" or "sticky"),
// {…decided_by}, {…user} and {…app}, and with log_decisions logs each
// pick.
type L4Policy struct {
	Config

	policy   *policy
	selector *pubsel.Selector[*l4proxy.Upstream]
	observe  bool // latency traffic or both, or within p2c: time each connect (and count it in flight)
}

// CaddyModule returns the Caddy module information.
func (L4Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.proxy.selection_policies.latency_bucket",
		New: func() caddy.Module { return new(L4Policy) },
	}
}

// Provision adopts the policy state of its name (or makes it), applies this
// config to it and holds the upstreams of the enclosing proxy handler.
func (p *L4Policy) Provision(ctx caddy.Context) error {
	var dials []string
	for _, m := range ctx.Modules() {
		if h, ok := m.(*l4proxy.Handler); ok {
			dials = dials[:0]
			for _, u := range h.Upstreams {
				if len(u.Dial) > 0 {
					dials = append(dials, u.Dial[0])
				}
			}
		}
	}
	p.policy = new(policy)
	if err := p.policy.provision(ctx, &p.Config, "layer4", dials); err != nil {
		return err
	}
	p.selector = &pubsel.Selector[*l4proxy.Upstream]{
		Tracker:     p.policy.state.Tracker(),
		Holder:      p.policy.lease.Holder(),
		Host:        l4Host{},
		Sticky:      p.policy.table,
		StickyStore: p.policy.stickyStore,
		Picks:       p.policy.picks,
		Within:      p.Config.within(),
		Choices:     p.Config.choices(),
		SlowStart:   time.Duration(p.Config.SlowStart),
	}
	p.observe = p.Config.source() != pubsel.FromProbe || p.Config.within() == pubsel.WithinP2C
	return nil
}

// Validate checks the configuration.
func (p *L4Policy) Validate() error { return p.Config.Validate(true) }

// Cleanup gives back this config generation's hold on the policy state.
func (p *L4Policy) Cleanup() error {
	if p.policy != nil {
		p.policy.cleanup()
	}
	return nil
}

// Select picks the upstream for a connection.
func (p *L4Policy) Select(pool l4proxy.UpstreamPool, conn *layer4.Connection) *l4proxy.Upstream {
	var repl *caddy.Replacer
	if conn != nil {
		repl = conn.Replacer()
	}
	var (
		u  *l4proxy.Upstream
		d  pubsel.Decision
		ok bool
	)
	user, app, pin := p.identity(conn, repl)
	if pin {
		u, d, ok = p.selector.Select(pool, user, app, p.policy.now())
	} else {
		u, d, ok = p.selector.SelectUnpinned(pool, p.policy.now())
	}
	if !ok {
		return nil
	}
	if d.Status != nil {
		if repl != nil {
			setPlaceholders(repl, l4Keys, d, user, app)
		}
		if p.LogDecisions {
			p.policy.logDecision(conn, d, user, app)
		}
		if p.observe && conn != nil {
			armDial(conn, p.selector.Tracker, d.Status.Addr)
		}
	}
	return u
}

// identity names the (user, app) pair: the configured placeholders, else
// the remote IP and the listener address. A sticky_user that comes out
// empty falls back to the remote IP, or with sticky_user_fallback none
// leaves the connection unpinned (pin false), as does sticky off.
func (p *L4Policy) identity(conn *layer4.Connection, repl *caddy.Replacer) (user, app string, pin bool) {
	if p.policy.table == nil || conn == nil {
		return "", "", false
	}
	if p.StickyUser != "" && repl != nil {
		user = repl.ReplaceAll(p.StickyUser, "")
	}
	if user == "" {
		if p.StickyUser != "" && p.StickyUserFallback == "none" {
			return "", "", false
		}
		if ra := conn.RemoteAddr(); ra != nil {
			user = ra.String()
			if host, _, err := net.SplitHostPort(user); err == nil {
				user = host
			}
		}
	}
	if p.StickyApp != "" && repl != nil {
		app = repl.ReplaceAll(p.StickyApp, "")
	} else if la := conn.LocalAddr(); la != nil {
		app = la.String()
	}
	return user, app, true
}

// l4Host adapts caddy-l4's upstreams. Their health and connection counts
// are unexported; FirstSelection over a one-upstream pool reports whether
// the upstream is available (healthy and not full).
type l4Host struct{}

var firstAvailable l4proxy.FirstSelection

func (l4Host) Addr(u *l4proxy.Upstream) string {
	if len(u.Dial) == 0 {
		return ""
	}
	return probeAddr(u.Dial[0])
}

func (l4Host) Available(u *l4proxy.Upstream) bool {
	one := [1]*l4proxy.Upstream{u}
	return firstAvailable.Select(one[:], nil) != nil
}

func (l4Host) Conns(*l4proxy.Upstream) int { return 0 }

// Interface guards
var (
	_ l4proxy.Selector      = (*L4Policy)(nil)
	_ caddy.Provisioner     = (*L4Policy)(nil)
	_ caddy.Validator       = (*L4Policy)(nil)
	_ caddy.CleanerUpper    = (*L4Policy)(nil)
	_ caddyfile.Unmarshaler = (*L4Policy)(nil)
)
