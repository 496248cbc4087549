package peerratelimit

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/diameter"
)

func init() {
	caddy.RegisterModule(L4Handler{})
}

// L4Handler limits new connections per peer (the remote IP, or a
// placeholder). Past a limit, "reject" writes the profile's message, if
// any, and closes; "drop" closes with nothing written. Message types are
// an HTTP notion until a protocol-aware layer4 mode classifies messages.
//
// Placeholders: {l4.peer_rate_limit.verdict}, {…profile}, {…limit}.
type L4Handler struct {
	leasedConfig // name (default "layer4-<config hash>"), profiles, dynamic

	// Diameter, if set, limits Diameter requests by message type instead
	// of connections (see DiameterMode).
	Diameter *DiameterMode `json:"diameter,omitempty"`

	profiles []*profile
	queue    diameter.QueuePolicy // Diameter mode's refusal queue
	// originMismatch counts Diameter requests whose Origin-Host is not
	// their connection's CER's.
	originMismatch prometheus.Counter
}

// CaddyModule returns the Caddy module information.
func (L4Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.peer_rate_limit",
		New: func() caddy.Module { return new(L4Handler) },
	}
}

// Provision builds the profiles and adopts the state kept under the
// handler's name (see leasedConfig.Name).
func (h *L4Handler) Provision(ctx caddy.Context) error {
	fp := fingerprint(h)
	if h.Name == "" {
		name, err := defaultName("layer4", h)
		if err != nil {
			return err
		}
		h.Name = name
	}
	if h.Diameter != nil {
		if err := h.Diameter.validate(); err != nil {
			return err
		}
		h.Diameter.fillDefaults()
		if err := registerMetrics(ctx); err != nil {
			return err
		}
		h.queue = diameter.QueuePolicy{
			Max:     h.Diameter.MaxQueuedRefusals,
			Wait:    time.Duration(h.Diameter.RefusalWait),
			Full:    theMetrics.refusalsDiscarded.WithLabelValues(h.Name, "queue_full"),
			Stalled: theMetrics.refusalsDiscarded.WithLabelValues(h.Name, "upstream_stalled"),
		}
		h.originMismatch = theMetrics.originMismatch.WithLabelValues(h.Name)
	}
	for _, p := range h.Profiles {
		if len(p.Messages) > 0 && h.Diameter == nil {
			return fmt.Errorf("peer_rate_limit: profile %s: message limits need the diameter mode; plain layer4 limits connections per peer", p.Name)
		}
		for _, m := range p.Messages {
			if m.MatchRaw != nil {
				return fmt.Errorf("peer_rate_limit: profile %s: message %s: match applies to HTTP; Diameter types are named (gx-ccr-i, gy-ccr-t, …)", p.Name, m.Type)
			}
		}
	}
	profiles, engines, dynamicRules, err := buildProfiles(ctx, h.Profiles)
	if err != nil {
		return err
	}
	h.profiles = profiles
	h.lease, err = provisionState(ctx, "layer4", h.Name, fp, h.Profiles, engines, h.Dynamic, dynamicRules, h)
	return err
}

// remoteAddr is the connection's remote IP.
func remoteAddr(cx *layer4.Connection) netip.Addr {
	switch a := cx.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// profileFor returns the first profile covering the connection's peer (or,
// in Diameter mode, the request being decided).
func (h *L4Handler) profileFor(cx *layer4.Connection) *profile {
	addr, repl := remoteAddr(cx), cx.Replacer()
	for _, p := range h.profiles {
		if p.cfg.covers(addr, repl) {
			return p
		}
	}
	return nil
}

// Handle admits the connection to the next handler, or closes it; in
// Diameter mode it limits each request on the connection instead.
func (h *L4Handler) Handle(cx *layer4.Connection, next layer4.Handler) error {
	if h.Diameter != nil {
		return h.handleDiameter(cx, next, func() string { return remoteAddr(cx).String() })
	}
	p := h.profileFor(cx)
	if p == nil {
		return next.Handle(cx)
	}
	repl := cx.Replacer()
	var verdict int
	if key, ok := p.peerKey(repl, remoteAddr(cx).String()); ok {
		verdict, _ = p.decide(key, 0, "", repl, l4Placeholders)
	} else {
		verdict = p.refuseUnnamed(0, repl, l4Placeholders)
	}
	switch verdict {
	case admitted:
		return next.Handle(cx)
	case rejected:
		if p.cfg.Message != "" {
			cx.Write([]byte(p.cfg.Message + "\n"))
		}
	}
	return cx.Close()
}

// UnmarshalCaddyfile reads
//
//	peer_rate_limit {
//		name <name>
//		profile <name> {
//			peer <placeholder>
//			peer_cidr <cidr...>
//			rate <connections per second> [burst]
//			action reject [<ignored status> [<message>]] | drop
//			max_peers <n>
//			dynamic
//		}
//		dynamic { … }
//		diameter {                          # limit Diameter requests, not connections
//			origin_host <identity>
//			origin_realm <realm>
//			result_code <code>              # default 3002
//			error_message <text>
//			max_length <bytes>
//			max_queued_refusals <n>         # default 256
//			refusal_wait <duration>         # default 5s
//		}
//	}
//
// In diameter mode a profile's message blocks name Diameter types
// (gx-ccr-i, gx-ccr-t, gy-ccr-u, …) and take rate and dynamic.
func (h *L4Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	noMatch := func(*cfparse.Block, *MessageConfig) (bool, error) { return false, nil }
	return h.unmarshalCaddyfile(d, noMatch, func(o *cfparse.Block) (bool, error) {
		if o.Name() != "diameter" {
			return false, nil
		}
		m, err := unmarshalDiameter(o)
		h.Diameter = m
		return true, err
	})
}

// Interface guards
var (
	_ layer4.NextHandler    = (*L4Handler)(nil)
	_ caddy.Provisioner     = (*L4Handler)(nil)
	_ caddy.CleanerUpper    = (*L4Handler)(nil)
	_ caddyfile.Unmarshaler = (*L4Handler)(nil)
)
