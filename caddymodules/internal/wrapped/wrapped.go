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

// Inner is the transport a wrapper wraps. A wrapper embeds it, so that the
// wrapped transport's optional abilities (TLS, the PROXY protocol) pass
// through and reverse_proxy treats the wrapper as it would treat the
// transport itself. It has no exported fields: it adds nothing to the
// wrapper's JSON.
type Inner struct {
	rt     http.RoundTripper
	module string // the wrapper's transport name, for EnableTLS's error
}

// Wrap is the Inner of rt, for a wrapper named module ("latency_bucket").
func Wrap(rt http.RoundTripper, module string) Inner { return Inner{rt, module} }

// Load loads owner's wrapped transport from its field TransportRaw (raw
// points to it), "http" when unset, into i. module is the wrapper's
// transport name; what prefixes errors.
func (i *Inner) Load(ctx caddy.Context, owner any, raw *json.RawMessage, module, what string) error {
	if *raw == nil {
		*raw = caddyconfig.JSONModuleObject(struct{}{}, "protocol", "http", nil)
	}
	mod, err := ctx.LoadModule(owner, "TransportRaw")
	if err != nil {
		return fmt.Errorf("%s: loading the wrapped transport: %v", what, err)
	}
	rt, ok := mod.(http.RoundTripper)
	if !ok {
		return fmt.Errorf("%s: the wrapped transport %T cannot round-trip requests", what, mod)
	}
	*i = Inner{rt, module}
	return nil
}

// Forward sends req with the wrapped transport.
func (i Inner) Forward(req *http.Request) (*http.Response, error) { return i.rt.RoundTrip(req) }

// TLSEnabled reports whether the wrapped transport uses TLS.
func (i Inner) TLSEnabled() bool {
	tt, ok := i.rt.(reverseproxy.TLSTransport)
	return ok && tt.TLSEnabled()
}

// EnableTLS is refused: TLS is configured on the wrapped transport.
func (i Inner) EnableTLS(*reverseproxy.TLSConfig) error {
	return fmt.Errorf("%s: set tls on the wrapped transport (transport %s { transport http { tls } })", i.module, i.module)
}

// ProxyProtocolEnabled reports the wrapped transport's PROXY protocol
// setting.
func (i Inner) ProxyProtocolEnabled() bool {
	pp, ok := i.rt.(reverseproxy.ProxyProtocolTransport)
	return ok && pp.ProxyProtocolEnabled()
}

// CleanupInner cleans up the wrapped transport if it needs it (the
// wrapper's own Cleanup calls it).
func (i Inner) CleanupInner() error {
	if c, ok := i.rt.(caddy.CleanerUpper); ok {
		return c.Cleanup()
	}
	return nil
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
