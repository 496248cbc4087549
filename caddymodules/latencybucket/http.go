package latencybucket

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/internal/pubsel"
)

func init() {
	caddy.RegisterModule(HTTPPolicy{})
}

// HTTPPolicy is the latency_bucket selection policy of reverse_proxy.
//
// It sets the placeholders {http.reverse_proxy.latency_bucket.publisher},
// {…latency_ms}, {…bucket}, {…decision} ("new" or "sticky"),
// {…decided_by} ("probe" or "traffic"), {…user} and {…app}.
type HTTPPolicy struct {
	Config

	policy   *policy
	selector *pubsel.Selector[*reverseproxy.Upstream]
}

// CaddyModule returns the Caddy module information.
func (HTTPPolicy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.latency_bucket",
		New: func() caddy.Module { return new(HTTPPolicy) },
	}
}

// Provision adopts the policy state of its name (or makes it), applies this
// config to it and holds the upstreams of the enclosing reverse_proxy.
func (h *HTTPPolicy) Provision(ctx caddy.Context) error {
	var dials []string
	var handler *reverseproxy.Handler
	for _, m := range ctx.Modules() {
		if rp, ok := m.(*reverseproxy.Handler); ok {
			handler = rp
			dials = dials[:0]
			for _, u := range rp.Upstreams {
				dials = append(dials, u.Dial)
			}
		}
	}
	// Real requests are timed by the latency_bucket transport of the same
	// reverse_proxy, if it has one (also with latency probe: the admin
	// view shows what it observes).
	var t *TrafficTransport
	if handler != nil {
		t = transportOf(handler)
	}
	if t == nil && h.Config.source() != pubsel.FromProbe {
		return fmt.Errorf("latency_bucket: latency %s: this reverse_proxy's requests are not observed; "+
			"wrap its transport: transport latency_bucket { transport http { … } }", h.Latency)
	}
	if t == nil && h.Config.within() == pubsel.WithinP2C {
		return fmt.Errorf("latency_bucket: within p2c: this reverse_proxy's requests in flight are not counted; " +
			"wrap its transport: transport latency_bucket { transport http { … } }")
	}
	if err := h.provisionSelector(ctx, dials); err != nil {
		return err
	}
	if t != nil {
		t.feed(h.policy.state.Tracker(), h.policy.now)
	}
	return nil
}

// provisionSelector adopts the policy state and makes the selector over
// the upstreams dials.
func (h *HTTPPolicy) provisionSelector(ctx caddy.Context, dials []string) error {
	h.policy = new(policy)
	if err := h.policy.provision(ctx, &h.Config, "http", dials); err != nil {
		return err
	}
	h.selector = &pubsel.Selector[*reverseproxy.Upstream]{
		Tracker:     h.policy.state.Tracker(),
		Holder:      h.policy.lease.Holder(),
		Host:        httpHost{},
		Within:      h.Config.within(),
		Choices:     h.Config.choices(),
		SlowStart:   time.Duration(h.Config.SlowStart),
		Sticky:      h.policy.table,
		StickyStore: h.policy.stickyStore,
		Picks:       h.policy.picks,
	}
	return nil
}

// Validate checks the configuration.
func (h *HTTPPolicy) Validate() error { return h.Config.Validate(false) }

// Cleanup gives back this config generation's hold on the policy state.
func (h *HTTPPolicy) Cleanup() error {
	if h.policy != nil {
		h.policy.cleanup()
	}
	return nil
}

// Select picks the upstream for r.
func (h *HTTPPolicy) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	var (
		u  *reverseproxy.Upstream
		d  pubsel.Decision
		ok bool
	)
	user, app, pin := h.identity(r, repl)
	if pin {
		u, d, ok = h.selector.Select(pool, user, app, h.policy.now())
	} else {
		u, d, ok = h.selector.SelectUnpinned(pool, h.policy.now())
	}
	if !ok {
		return nil
	}
	if repl != nil && d.Status != nil {
		setPlaceholders(repl, httpKeys, d, user, app)
	}
	return u
}

// identity names the (user, app) pair: the configured placeholders, else
// the client IP (which honours trusted_proxies) and the request host. A
// sticky_user that comes out empty falls back to the client IP, or with
// sticky_user_fallback none leaves the request unpinned (pin false), as
// does sticky off.
func (h *HTTPPolicy) identity(r *http.Request, repl *caddy.Replacer) (user, app string, pin bool) {
	if h.policy.table == nil {
		return "", "", false
	}
	if h.StickyUser != "" && repl != nil {
		user = repl.ReplaceAll(h.StickyUser, "")
	}
	if user == "" {
		if h.StickyUser != "" && h.StickyUserFallback == "none" {
			return "", "", false
		}
		if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok {
			user = ip
		} else {
			user = r.RemoteAddr
		}
	}
	if h.StickyApp != "" && repl != nil {
		app = repl.ReplaceAll(h.StickyApp, "")
	} else {
		app = r.Host
	}
	return user, app, true
}

type httpHost struct{}

func (httpHost) Addr(u *reverseproxy.Upstream) string    { return probeAddr(u.Dial) }
func (httpHost) Available(u *reverseproxy.Upstream) bool { return u.Available() }
func (httpHost) Conns(u *reverseproxy.Upstream) int      { return u.NumRequests() }

// Interface guards
var (
	_ reverseproxy.Selector = (*HTTPPolicy)(nil)
	_ caddy.Provisioner     = (*HTTPPolicy)(nil)
	_ caddy.Validator       = (*HTTPPolicy)(nil)
	_ caddy.CleanerUpper    = (*HTTPPolicy)(nil)
	_ caddyfile.Unmarshaler = (*HTTPPolicy)(nil)
)
