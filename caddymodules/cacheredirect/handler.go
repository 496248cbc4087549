// Package cacheredirect provides http.handlers.cache_redirect, the lower
// tier of N-tier cache redirection: cacheable requests go to the cache pool
// (one URL stays on one cache, by Caddy's uri_hash), others bypass to the
// origin, the client's address travels in a header, and requests a cache
// sends back on a miss go to the origin with a source port from this
// node's exclusive range (http.reverse_proxy.transport.port_range).
// Decisions are internal/cacheroute.
package cacheredirect

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	prmod "github.com/edgesteer/edgesteer/caddymodules/portrange"
	"github.com/edgesteer/edgesteer/internal/cacheroute"
)

func init() {
	caddy.RegisterModule(&CacheRedirect{})
}

// defaultCacheTimeout is below varnish's own first_byte_timeout (60 s), so
// a miss the cache is still fetching is not cut short by a stricter limit
// of ours in ordinary cases.
const defaultCacheTimeout = 30 * time.Second

// CacheRedirect is a terminal handler: it proxies every request, to a
// cache or to the origin.
type CacheRedirect struct {
	// Node names this lower-tier node in metrics and placeholders
	// (default: the tier map node of the origin transport, else "lower").
	Node string `json:"node,omitempty"`
	// Caches are the cache servers' dial addresses (host:port).
	Caches []string `json:"caches"`
	// Origin are the origin servers' dial addresses.
	Origin []string `json:"origin"`
	// ClientIPHeader carries the client's address (default "Client-IP").
	ClientIPHeader string `json:"client_ip_header,omitempty"`
	// Trusted peers (CIDRs or addresses) may supply ClientIPHeader and
	// X-Forwarded-For: other tiers. From anyone else a client-supplied copy
	// is replaced.
	Trusted []string `json:"trusted,omitempty"`
	// CachePeers are the addresses a cache fetches misses from (default:
	// the caches' own IPs); their requests go to the origin and are trusted.
	CachePeers []string `json:"cache_peers,omitempty"`
	// Cacheability: Methods (default GET HEAD); requests with
	// Authorization or Upgrade always bypass; bypass rules on path globs,
	// cookie names and header value globs ("" = presence).
	Methods       []string          `json:"methods,omitempty"`
	BypassPaths   []string          `json:"bypass_paths,omitempty"`
	BypassCookies []string          `json:"bypass_cookies,omitempty"`
	BypassHeaders map[string]string `json:"bypass_headers,omitempty"`
	// CacheFailDuration is how long a cache that failed is skipped (its
	// URLs move to the other caches meanwhile; default 10s).
	CacheFailDuration caddy.Duration `json:"cache_fail_duration,omitempty"`
	// CacheTimeout bounds the wait for a cache's response headers (default
	// 30s): a cache that accepts and then hangs fails the try, is skipped
	// for CacheFailDuration, and a GET is retried on the next cache.
	CacheTimeout caddy.Duration `json:"cache_timeout,omitempty"`
	// OriginTransport sets the source ports (and USIP) of connections to the
	// origin; without it they use Caddy's http transport as is.
	OriginTransport *prmod.Transport `json:"origin_transport,omitempty"`

	router   cacheroute.Router
	clientIP *cacheroute.ClientIP
	up       func() bool // c.cacheUp, bound once
	cache    *reverseproxy.Handler
	origin   *reverseproxy.Handler
	logger   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*CacheRedirect) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.cache_redirect",
		New: func() caddy.Module { return new(CacheRedirect) },
	}
}

// Provision checks the configuration and builds the two proxies.
func (c *CacheRedirect) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	if len(c.Caches) == 0 || len(c.Origin) == 0 {
		return errors.New("cache_redirect: caches and origin are required")
	}
	trustedCIDRs, err := c.provisionRouting()
	if err != nil {
		return err
	}
	if err := c.provisionTimeouts(); err != nil {
		return err
	}
	if err := c.provisionCache(ctx, trustedCIDRs); err != nil {
		return err
	}
	if err := c.provisionOrigin(ctx, trustedCIDRs); err != nil {
		return err
	}
	if err := registerMetrics(ctx); err != nil {
		return err
	}
	handlers.Add(c)
	return nil
}

// provisionRouting builds the cacheability policy and the client-IP
// resolver, and returns the prefixes trusted to send a client address (the
// configured ones and the caches) as CIDR strings for the proxies.
func (c *CacheRedirect) provisionRouting() ([]string, error) {
	if c.ClientIPHeader == "" {
		c.ClientIPHeader = "Client-IP"
	}
	c.router.Policy = cacheroute.Policy{Methods: c.Methods, BypassPaths: c.BypassPaths,
		BypassCookies: c.BypassCookies, BypassHeaders: c.BypassHeaders}
	if err := c.router.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("cache_redirect: %w", err)
	}
	trusted, err := cacheroute.ParsePrefixes(c.Trusted)
	if err != nil {
		return nil, fmt.Errorf("cache_redirect: trusted: %w", err)
	}
	peers := c.CachePeers
	if len(peers) == 0 {
		for _, a := range c.Caches {
			host, _, err := net.SplitHostPort(a)
			if err != nil {
				return nil, fmt.Errorf("cache_redirect: caches: %q: want host:port", a)
			}
			peers = append(peers, host)
		}
	}
	if c.router.CachePeers, err = cacheroute.ParsePrefixes(peers); err != nil {
		return nil, fmt.Errorf("cache_redirect: cache_peers (or cache hosts, which must be IPs): %w", err)
	}
	c.clientIP = cacheroute.NewClientIP(c.ClientIPHeader, append(trusted, c.router.CachePeers...))
	var trustedCIDRs []string
	for _, p := range c.clientIP.Trusted {
		trustedCIDRs = append(trustedCIDRs, p.String())
	}
	return trustedCIDRs, nil
}

// provisionTimeouts fills the cache pool's defaults and checks them.
func (c *CacheRedirect) provisionTimeouts() error {
	if c.CacheFailDuration == 0 {
		c.CacheFailDuration = caddy.Duration(10 * time.Second)
	}
	if c.CacheTimeout == 0 {
		c.CacheTimeout = caddy.Duration(defaultCacheTimeout)
	}
	if c.CacheTimeout < 0 || c.CacheFailDuration < 0 {
		return fmt.Errorf("cache_redirect: cache_timeout %v and cache_fail_duration %v must be positive",
			time.Duration(c.CacheTimeout), time.Duration(c.CacheFailDuration))
	}
	return nil
}

// provisionCache builds the cache pool: Caddy's reverse proxy with URL-hash
// (rendezvous) selection and passive health, one try per cache.
func (c *CacheRedirect) provisionCache(ctx caddy.Context, trustedCIDRs []string) error {
	cache := &reverseproxy.Handler{
		TransportRaw: caddyconfig.JSONModuleObject(&reverseproxy.HTTPTransport{ResponseHeaderTimeout: c.CacheTimeout},
			"protocol", "http", nil),
		Upstreams: upstreams(c.Caches),
		LoadBalancing: &reverseproxy.LoadBalancing{
			SelectionPolicy: &reverseproxy.URIHashSelection{},
			Retries:         len(c.Caches) - 1,
		},
		HealthChecks: &reverseproxy.HealthChecks{Passive: &reverseproxy.PassiveHealthChecks{
			FailDuration: c.CacheFailDuration, MaxFails: 1,
		}},
		TrustedProxies: trustedCIDRs,
	}
	if err := cache.Provision(ctx); err != nil {
		return fmt.Errorf("cache_redirect: cache pool: %w", err)
	}
	c.cache = cache
	c.up = c.cacheUp
	return nil
}

// provisionOrigin builds the origin proxy, through origin_transport when
// set (whose node names this one unless node is given).
func (c *CacheRedirect) provisionOrigin(ctx caddy.Context, trustedCIDRs []string) error {
	origin := &reverseproxy.Handler{Upstreams: upstreams(c.Origin), TrustedProxies: trustedCIDRs}
	if t := c.OriginTransport; t != nil {
		if err := t.Provision(ctx); err != nil {
			return fmt.Errorf("cache_redirect: origin: %w", err)
		}
		origin.Transport = t
		if c.Node == "" {
			c.Node = t.Node
		}
	}
	if err := origin.Provision(ctx); err != nil {
		return fmt.Errorf("cache_redirect: origin: %w", err)
	}
	c.origin = origin
	if c.Node == "" {
		c.Node = "lower"
	}
	return nil
}

func upstreams(addrs []string) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, len(addrs))
	for i, a := range addrs {
		pool[i] = &reverseproxy.Upstream{Dial: a}
	}
	return pool
}

// ServeHTTP decides the path, carries the client address and proxies.
func (c *CacheRedirect) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	peer := remoteIP(r)
	client, _, forged := c.clientIP.Resolve(peer, r.Header)
	if forged {
		forgedTotal.WithLabelValues(c.Node).Inc()
		c.logger.Debug("replaced a client-supplied client IP header",
			zap.String("header", c.ClientIPHeader), zap.String("peer", peer.String()))
	}
	if client.IsValid() {
		r.Header[c.clientIP.Header()] = []string{client.String()}
		caddyhttp.SetVar(r.Context(), prmod.ClientIPVar, client)
	} else {
		delete(r.Header, c.clientIP.Header()) // no IP peer (a unix socket): say nothing rather than be forged
	}

	path, reason := c.router.Route(r, peer, c.up)
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.cache_redirect.path", path)
		repl.Set("http.cache_redirect.reason", reason)
		repl.Set("http.cache_redirect.client_ip", client.String())
		repl.Set("http.cache_redirect.node", c.Node)
	}
	requestsTotal.WithLabelValues(c.Node, path).Inc()
	if path == cacheroute.PathCache {
		return c.cache.ServeHTTP(w, r, next)
	}
	return c.origin.ServeHTTP(w, r, next)
}

func remoteIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// cacheUp reports whether any cache is available (not marked down by a
// failure, not at its connection limit).
func (c *CacheRedirect) cacheUp() bool {
	for _, u := range c.cache.Upstreams {
		if u.Available() {
			return true
		}
	}
	return false
}

// Cleanup stops both proxies.
func (c *CacheRedirect) Cleanup() error {
	handlers.Remove(c)
	var errs []error
	for _, h := range []*reverseproxy.Handler{c.cache, c.origin} {
		if h != nil {
			errs = append(errs, h.Cleanup())
		}
	}
	if c.OriginTransport != nil {
		errs = append(errs, c.OriginTransport.Cleanup())
	}
	return errors.Join(errs...)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*CacheRedirect)(nil)
	_ caddy.CleanerUpper          = (*CacheRedirect)(nil)
	_ caddyhttp.MiddlewareHandler = (*CacheRedirect)(nil)
)
