package portrange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

func init() {
	caddy.RegisterModule(&Transport{})
}

// ClientIPVar is the request variable through which a handler (such as
// cache_redirect) tells the transport the client's address for USIP. Without
// it, USIP uses the original request's remote address.
const ClientIPVar = "edgesteer.client_ip"

// Transport is Caddy's HTTP transport whose connections take their source
// port from a range: the lower-tier node's exclusive range in the tier map,
// or Ports. With USIP the source address is the client's own (IP_TRANSPARENT;
// needs CAP_NET_ADMIN and policy routing that returns replies to this node),
// and connections are not reused across requests, since each belongs to
// one client address.
type Transport struct {
	// Ports is the source port range, if no tier map is given.
	Ports string `json:"ports,omitempty"`
	TierMapSource
	// LocalIP is the source address (default, or 0.0.0.0 / ::: chosen by the
	// kernel for the route).
	LocalIP string `json:"local_ip,omitempty"`
	// USIP uses the client's IP as the source address.
	USIP bool `json:"usip,omitempty"`
	// HTTP is the rest of the transport's settings (Caddy's http transport:
	// timeouts, keepalive, TLS, buffers). Its local_address and
	// proxy_protocol are not available here.
	HTTP *reverseproxy.HTTPTransport `json:"http,omitempty"`

	dialer *srcports.Dialer
}

// CaddyModule returns the Caddy module information.
func (*Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.port_range",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision resolves the range and sets up the HTTP transport with the
// port-range dialer.
func (t *Transport) Provision(ctx caddy.Context) error {
	const what = "port_range transport"
	var r srcports.Range
	switch {
	case t.set() && t.Ports != "":
		return fmt.Errorf("%s: give ports or tier_map, not both", what)
	case t.set():
		var err error
		if r, _, err = t.nodeRange(what); err != nil {
			return err
		}
	case t.Ports != "":
		var err error
		if r, err = srcports.Parse(t.Ports); err != nil {
			return fmt.Errorf("%s: ports: %w", what, err)
		}
	default:
		return fmt.Errorf("%s: give ports or tier_map and node", what)
	}
	t.dialer = srcports.NewDialer(r)
	if t.LocalIP != "" {
		ip, err := netip.ParseAddr(t.LocalIP)
		if err != nil {
			return fmt.Errorf("%s: local_ip %q: not an address", what, t.LocalIP)
		}
		if t.USIP {
			return fmt.Errorf("%s: local_ip and usip exclude each other", what)
		}
		if !ip.IsUnspecified() { // 0.0.0.0 or ::, as an env default: the kernel picks
			t.dialer.LocalIP = ip
		}
	}
	t.dialer.Transparent = t.USIP
	if t.HTTP == nil {
		t.HTTP = new(reverseproxy.HTTPTransport)
	}
	if t.HTTP.LocalAddress != "" || t.HTTP.ProxyProtocol != "" {
		return fmt.Errorf("%s: http local_address / proxy_protocol are not supported here (use local_ip)", what)
	}
	if t.USIP {
		off := false
		if t.HTTP.KeepAlive == nil {
			t.HTTP.KeepAlive = new(reverseproxy.KeepAlive)
		}
		t.HTTP.KeepAlive.Enabled = &off
	}
	if err := t.HTTP.Provision(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	t.dialer.Timeout = time.Duration(t.HTTP.DialTimeout)
	t.HTTP.Transport.DialContext = t.dial
	registerMetrics(ctx)
	transports.Add(t)
	return nil
}

// dial replaces the HTTP transport's dialer. Errors are DialErrors, so
// reverse_proxy may retry another upstream as with its own dialer.
func (t *Transport) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	src := t.dialer.LocalIP // invalid without local_ip: the kernel picks
	if t.USIP {
		src = clientIP(ctx)
		if !src.IsValid() {
			return nil, reverseproxy.NewDialError(errors.New("usip: no client address for this request"))
		}
	}
	c, err := t.dialer.DialFrom(ctx, network, addr, src)
	if err != nil {
		if errors.Is(err, srcports.ErrExhausted) {
			exhausted.WithLabelValues(t.dialer.Ports.String()).Inc()
		}
		return nil, reverseproxy.NewDialError(err)
	}
	return c, nil
}

// clientIP is the address a handler put in ClientIPVar, or else the
// original request's remote address (the client's, behind a PROXY
// protocol listener wrapper).
func clientIP(ctx context.Context) netip.Addr {
	if a, ok := caddyhttp.GetVar(ctx, ClientIPVar).(netip.Addr); ok {
		return a
	}
	if or, ok := ctx.Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		if ap, err := netip.ParseAddrPort(or.RemoteAddr); err == nil {
			return ap.Addr().Unmap()
		}
	}
	return netip.Addr{}
}

// RoundTrip sends the request through the HTTP transport.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) { return t.HTTP.RoundTrip(r) }

// TLSEnabled tells reverse_proxy to speak https when the http block has tls.
func (t *Transport) TLSEnabled() bool { return t.HTTP != nil && t.HTTP.TLSEnabled() }

// EnableTLS is called by reverse_proxy's Caddyfile for https:// upstreams.
func (t *Transport) EnableTLS(base *reverseproxy.TLSConfig) error {
	if t.HTTP == nil {
		t.HTTP = new(reverseproxy.HTTPTransport)
	}
	return t.HTTP.EnableTLS(base)
}

// Cleanup releases the HTTP transport's idle connections.
func (t *Transport) Cleanup() error {
	transports.Remove(t)
	if t.HTTP == nil || t.HTTP.Transport == nil {
		return nil // provisioning failed before there was anything to release
	}
	return t.HTTP.Cleanup()
}

// Range is the source port range in use (after Provision).
func (t *Transport) Range() srcports.Range { return t.dialer.Ports }

// Interface guards
var (
	_ caddy.Provisioner         = (*Transport)(nil)
	_ caddy.CleanerUpper        = (*Transport)(nil)
	_ http.RoundTripper         = (*Transport)(nil)
	_ reverseproxy.TLSTransport = (*Transport)(nil)
	_ caddyfile.Unmarshaler     = (*Transport)(nil)
)
