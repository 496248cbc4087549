package peerratelimit

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"
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
	limiter // name (default "layer4"), profiles, dynamic

	profiles []*profile
}

// CaddyModule returns the Caddy module information.
func (L4Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.peer_rate_limit",
		New: func() caddy.Module { return new(L4Handler) },
	}
}

// Provision builds the profiles and starts dynamic throttling.
func (h *L4Handler) Provision(ctx caddy.Context) error {
	if h.Name == "" {
		h.Name = "layer4"
	}
	for _, p := range h.Profiles {
		if len(p.Messages) > 0 {
			return fmt.Errorf("peer_rate_limit: profile %s: message limits need a protocol-aware layer4 mode; plain layer4 limits connections per peer", p.Name)
		}
	}
	profiles, engines, dynamicRules, err := buildProfiles(ctx, h.Name, h.Profiles)
	if err != nil {
		return err
	}
	h.profiles = profiles
	h.runtime, err = newRuntime(h.Name, "layer4", engines, h.Dynamic, dynamicRules, ctx.Logger())
	return err
}

// Handle admits the connection to the next handler, or closes it.
func (h *L4Handler) Handle(cx *layer4.Connection, next layer4.Handler) error {
	var addr netip.Addr
	if ta, ok := cx.RemoteAddr().(*net.TCPAddr); ok {
		addr = ta.AddrPort().Addr().Unmap()
	} else if ua, ok := cx.RemoteAddr().(*net.UDPAddr); ok {
		addr = ua.AddrPort().Addr().Unmap()
	}
	var p *profile
	for _, cand := range h.profiles {
		if cand.cfg.covers(addr) {
			p = cand
			break
		}
	}
	if p == nil {
		return next.Handle(cx)
	}
	repl := cx.Replacer()
	key := addr.String()
	if p.cfg.Peer != "" {
		key = repl.ReplaceAll(p.cfg.Peer, "")
	}
	verdict, _ := p.decide(key, 0, "", repl, l4Placeholders)
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
//	}
func (h *L4Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return h.unmarshalCaddyfile(d, func(*caddyfile.Dispenser, *MessageConfig) (bool, error) { return false, nil })
}

// Interface guards
var (
	_ layer4.NextHandler    = (*L4Handler)(nil)
	_ caddy.Provisioner     = (*L4Handler)(nil)
	_ caddy.CleanerUpper    = (*L4Handler)(nil)
	_ caddyfile.Unmarshaler = (*L4Handler)(nil)
)
