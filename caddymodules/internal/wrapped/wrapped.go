// Package wrapped is what the edgesteer reverse_proxy transports that wrap
// another transport (peer_rate_limit's egress transport, latency_bucket's
// traffic transport) share: loading the wrapped transport, reading its
// Caddyfile block, and passing its optional abilities through so that
// reverse_proxy treats the wrapper as it would treat the transport itself.
package wrapped

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

// Load loads owner's wrapped transport from its field TransportRaw (raw
// points to it), "http" when unset. what prefixes errors.
func Load(ctx caddy.Context, owner any, raw *json.RawMessage, what string) (http.RoundTripper, error) {
	if *raw == nil {
		*raw = caddyconfig.JSONModuleObject(struct{}{}, "protocol", "http", nil)
	}
	mod, err := ctx.LoadModule(owner, "TransportRaw")
	if err != nil {
		return nil, fmt.Errorf("%s: loading the wrapped transport: %v", what, err)
	}
	rt, ok := mod.(http.RoundTripper)
	if !ok {
		return nil, fmt.Errorf("%s: the wrapped transport %T cannot round-trip requests", what, mod)
	}
	return rt, nil
}

// Unmarshal reads "transport <name> { … }", the wrapped transport, whose
// block is that module's own, and returns its JSON.
func Unmarshal(o *cfparse.Block) (json.RawMessage, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	args, err := o.BlockArgs(1, 1)
	if err != nil {
		return nil, err
	}
	unm, err := caddyfile.UnmarshalModule(o.Dispenser(), "http.reverse_proxy.transport."+args[0])
	if err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(unm, "protocol", args[0], nil), nil
}

// TLSEnabled reports whether inner uses TLS.
func TLSEnabled(inner http.RoundTripper) bool {
	tt, ok := inner.(reverseproxy.TLSTransport)
	return ok && tt.TLSEnabled()
}

// ProxyProtocolEnabled reports inner's PROXY protocol setting.
func ProxyProtocolEnabled(inner http.RoundTripper) bool {
	pp, ok := inner.(reverseproxy.ProxyProtocolTransport)
	return ok && pp.ProxyProtocolEnabled()
}

// Cleanup cleans up inner if it needs it.
func Cleanup(inner http.RoundTripper) error {
	if c, ok := inner.(caddy.CleanerUpper); ok {
		return c.Cleanup()
	}
	return nil
}
