// Package cacheroute holds the lower tier's decisions in N-tier cache
// redirection: is a request cacheable (go to the cache pool) or a bypass
// (straight to the origin), and which client address to carry in the
// Client-IP header. It knows nothing of Caddy.
package cacheroute

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"path"
	"slices"
	"strings"
)

// Policy decides cacheability the way cache-redirection policies do:
// only the listed methods, never with credentials or an upgrade, and not
// when a bypass rule matches.
type Policy struct {
	// Methods that may be cached (default GET, HEAD).
	Methods []string
	// BypassPaths match the path as Caddy's path matcher does: "/api/*"
	// is a prefix, "*.php" a suffix, anything else a glob.
	BypassPaths []string
	// BypassCookies are cookie names whose presence bypasses the cache.
	BypassCookies []string
	// BypassHeaders maps a header name to a glob on its value; an empty
	// glob means presence alone bypasses.
	BypassHeaders map[string]string

	headers []headerRule // BypassHeaders with canonical keys, in name order
}

type headerRule struct{ key, glob string }

// Validate checks the globs, naming the bad one, and prepares the rules;
// call it before Cacheable.
func (p *Policy) Validate() error {
	p.headers = p.headers[:0]
	for name, g := range p.BypassHeaders {
		p.headers = append(p.headers, headerRule{textproto.CanonicalMIMEHeaderKey(name), g})
	}
	slices.SortFunc(p.headers, func(a, b headerRule) int { return strings.Compare(a.key, b.key) })
	for _, g := range p.BypassPaths {
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("bypass path %q: %v", g, err)
		}
	}
	for h, g := range p.BypassHeaders {
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("bypass header %s %q: %v", h, g, err)
		}
	}
	for _, m := range p.Methods {
		if m == "" || strings.ToUpper(m) != m {
			return fmt.Errorf("method %q: want an upper-case HTTP method", m)
		}
	}
	return nil
}

// Cacheable reports whether r may go to the cache pool; if not, reason
// says why (for logs and the placeholder).
func (p *Policy) Cacheable(r *http.Request) (ok bool, reason string) {
	methods := p.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodGet, http.MethodHead}
	}
	if !slices.Contains(methods, r.Method) {
		return false, "method " + r.Method
	}
	if len(r.Header["Authorization"]) > 0 {
		return false, "authorization"
	}
	if len(r.Header["Upgrade"]) > 0 {
		return false, "upgrade"
	}
	for _, g := range p.BypassPaths {
		if matchPath(g, r.URL.Path) {
			return false, "path " + g
		}
	}
	for _, name := range p.BypassCookies {
		if hasCookie(r.Header["Cookie"], name) {
			return false, "cookie " + name
		}
	}
	for _, h := range p.headers {
		vals := r.Header[h.key]
		if len(vals) == 0 {
			continue
		}
		if h.glob == "" {
			return false, "header " + h.key
		}
		for _, v := range vals {
			if ok, _ := path.Match(h.glob, v); ok {
				return false, "header " + h.key
			}
		}
	}
	return true, ""
}

// hasCookie reports whether a Cookie header names the cookie; it scans the
// pairs instead of parsing them all (http.Request.Cookie allocates).
func hasCookie(lines []string, name string) bool {
	for _, line := range lines {
		for line != "" {
			var pair string
			pair, line, _ = strings.Cut(line, ";")
			pair = strings.TrimLeft(pair, " ")
			if len(pair) > len(name) && pair[len(name)] == '=' && pair[:len(name)] == name {
				return true
			}
		}
	}
	return false
}

// matchPath follows Caddy's path matcher: a leading or trailing * is a
// suffix or prefix match across slashes ("/api/*", "*.php"); otherwise a
// glob.
func matchPath(glob, p string) bool {
	inner := strings.Trim(glob, "*")
	switch {
	case strings.ContainsAny(inner, "*?["):
	case strings.HasPrefix(glob, "*") && strings.HasSuffix(glob, "*") && len(glob) > 1:
		return strings.Contains(p, inner)
	case strings.HasPrefix(glob, "*"):
		return strings.HasSuffix(p, inner)
	case strings.HasSuffix(glob, "*"):
		return strings.HasPrefix(p, inner)
	}
	ok, _ := path.Match(glob, p)
	return ok
}

// ClientIP carries the client's address between tiers in Header. Only a
// trusted peer (a cache sending a miss back, another tier) may supply it;
// from anyone else a client-supplied copy is a forgery and is replaced.
type ClientIP struct {
	header  string // canonical
	Trusted []netip.Prefix
}

// NewClientIP carries the address in header, trusting those prefixes.
func NewClientIP(header string, trusted []netip.Prefix) *ClientIP {
	return &ClientIP{header: textproto.CanonicalMIMEHeaderKey(header), Trusted: trusted}
}

// Header is the header's canonical name.
func (c *ClientIP) Header() string { return c.header }

// Resolve returns the client address for a request from peer: the
// header's when the peer is trusted and the header holds one address,
// else the peer itself. forged reports a header sent by an untrusted peer.
func (c *ClientIP) Resolve(peer netip.Addr, h http.Header) (client netip.Addr, fromHeader, forged bool) {
	vals := h[c.header]
	if len(vals) == 0 {
		return peer, false, false
	}
	if !c.IsTrusted(peer) {
		return peer, false, true
	}
	if len(vals) == 1 {
		if a, err := netip.ParseAddr(strings.TrimSpace(vals[0])); err == nil {
			return a.Unmap(), true, false
		}
	}
	return peer, false, false
}

// IsTrusted reports whether peer lies in a trusted prefix.
func (c *ClientIP) IsTrusted(peer netip.Addr) bool {
	peer = peer.Unmap()
	for _, p := range c.Trusted {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// ParsePrefixes reads CIDRs or single addresses.
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%q: not an address or CIDR", s)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q: not an address or CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// The paths a request can take.
const (
	PathCache    = "cache"    // cacheable: to the cache pool
	PathBypass   = "bypass"   // not cacheable: straight to the origin
	PathMiss     = "miss"     // sent by a cache on a miss: to the origin
	PathFallback = "fallback" // cacheable, but no cache is available
)

// Router decides a request's path on a lower-tier node.
type Router struct {
	Policy Policy
	// CachePeers are where caches fetch misses from: their requests go to
	// the origin.
	CachePeers []netip.Prefix
}

// Route returns the path of r from peer, and why when it is not the cache;
// cacheUp tells whether any cache is available.
func (rt *Router) Route(r *http.Request, peer netip.Addr, cacheUp func() bool) (path, reason string) {
	for _, p := range rt.CachePeers {
		if p.Contains(peer.Unmap()) {
			return PathMiss, "from cache"
		}
	}
	if ok, reason := rt.Policy.Cacheable(r); !ok {
		return PathBypass, reason
	}
	if !cacheUp() {
		return PathFallback, "no cache available"
	}
	return PathCache, ""
}
