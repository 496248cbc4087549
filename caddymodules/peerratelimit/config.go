// Package peerratelimit provides the peer_rate_limit handlers for Caddy HTTP
// (http.handlers.peer_rate_limit) and caddy-l4 (layer4.handlers.peer_rate_limit):
// Cisco vDRA's peer and message rate limiting, static and dynamic. The
// algorithm lives in internal/ratelimit; this package adapts it.
package peerratelimit

import (
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// ProfileConfig is a peer rate-limit profile: which peers it covers, its
// overall limit per peer, its message limits, and what to do past them.
type ProfileConfig struct {
	Name string `json:"name"`
	// Peer is a placeholder naming the peer whose limits apply. Default:
	// the client IP (HTTP) or remote IP (layer4).
	Peer string `json:"peer,omitempty"`
	// MissingPeer is what happens when Peer's value is empty (a header
	// the request lacks): "fallback" (default) limits the request under
	// the key the profile uses without Peer — the client IP (HTTP,
	// honouring trusted_proxies), the remote IP (layer4), the CER's
	// Origin-Host or the remote IP (Diameter) — kept apart from the keys
	// Peer names; "refuse" refuses it as the action says.
	MissingPeer string `json:"missing_peer,omitempty"`
	// PeerCIDRs: the profile covers only clients in these ranges (a named
	// peer group). Default: every client. The first profile that covers a
	// client applies.
	PeerCIDRs []string `json:"peer_cidrs,omitempty"`
	// Select: the profile covers only requests whose placeholder has one
	// of the values (a named peer group: a header naming the peer, the
	// Diameter Origin-Host, a TLS client certificate name). With
	// PeerCIDRs, both must hold.
	Select *SelectConfig `json:"select,omitempty"`
	// Rate is the overall limit per peer in messages per second (0: none);
	// Burst its burst (default ⌈Rate/20⌉ + 1: 1/20 s of traffic plus one).
	Rate  float64 `json:"rate,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// Messages are limits per message type; other types are forwarded as
	// received, subject to Rate.
	Messages []MessageConfig `json:"messages,omitempty"`
	// Action past a limit: "reject" (default) or "drop".
	Action string `json:"action,omitempty"`
	// Status and Message of a rejection (HTTP default 429 and "rate limit
	// exceeded").
	Status  int    `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	// MaxPeers bounds each of the profile's per-peer tables (default 100000).
	MaxPeers int `json:"max_peers,omitempty"`
	// Dynamic: the dynamic controller throttles the overall rate too.
	Dynamic bool `json:"dynamic,omitempty"`

	prefixes []netip.Prefix
}

// SelectConfig selects a profile by a placeholder's value.
type SelectConfig struct {
	// Placeholder, e.g. "{http.request.header.X-Peer}".
	Placeholder string `json:"placeholder"`
	// Values the placeholder may have; shell patterns (path.Match: *, ?,
	// [...]) match several, e.g. "pgw*.example". An empty value never
	// matches.
	Values []string `json:"values"`
}

// matches reports whether v is one of the values.
func (s *SelectConfig) matches(v string) bool {
	if v == "" {
		return false
	}
	for _, pat := range s.Values {
		if ok, _ := path.Match(pat, v); ok {
			return true
		}
	}
	return false
}

// MessageConfig is a message rate-limit profile.
type MessageConfig struct {
	// Type names the message type, e.g. "gx-ccr-i".
	Type string `json:"type"`
	// MatchRaw: the HTTP request matchers that recognise the type.
	MatchRaw caddy.ModuleMap `json:"match,omitempty" caddy:"namespace=http.matchers"`
	Rate     float64         `json:"rate"`
	Burst    int             `json:"burst,omitempty"`
	// Dynamic: the dynamic controller throttles this limit.
	Dynamic bool `json:"dynamic,omitempty"`
}

const defaultMaxPeers = 100_000

// Values of missing_peer.
const (
	missingFallback = "fallback"
	missingRefuse   = "refuse"
)

// build validates the profile and returns its engine form.
func (p *ProfileConfig) build() (*ratelimit.Profile, error) {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("peer_rate_limit: profile %s: %s %v: %s", p.Name, opt, v, why)
	}
	if p.Name == "" {
		return nil, fmt.Errorf("peer_rate_limit: a profile needs a name")
	}
	switch p.Action {
	case "", "reject", "drop":
	default:
		return nil, bad("action", strconv.Quote(p.Action), "want reject or drop")
	}
	switch p.MissingPeer {
	case "", missingFallback, missingRefuse:
	default:
		return nil, bad("missing_peer", strconv.Quote(p.MissingPeer), "want fallback or refuse")
	}
	if p.Status != 0 && (p.Status < 400 || p.Status > 599) {
		return nil, bad("status", p.Status, "want a 4xx or 5xx code")
	}
	if p.Rate < 0 {
		return nil, bad("rate", p.Rate, "must be positive")
	}
	if p.MaxPeers < 0 {
		return nil, bad("max_peers", p.MaxPeers, "must be positive")
	}
	if sel := p.Select; sel != nil {
		if !strings.Contains(sel.Placeholder, "{") || len(sel.Values) == 0 {
			return nil, bad("select", strconv.Quote(sel.Placeholder), "want a placeholder and at least one value")
		}
		for _, v := range sel.Values {
			if _, err := path.Match(v, ""); err != nil || v == "" {
				return nil, bad("select "+sel.Placeholder, strconv.Quote(v), "not a value or pattern")
			}
		}
	}
	p.prefixes = p.prefixes[:0]
	for _, c := range p.PeerCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			if a, err2 := netip.ParseAddr(c); err2 == nil {
				pfx = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, bad("peer_cidr", c, "not a CIDR or IP")
			}
		}
		p.prefixes = append(p.prefixes, pfx.Masked())
	}
	var overall *ratelimit.Rule
	if p.Rate > 0 {
		r, err := ratelimit.NewRule("overall", p.Rate, p.Burst)
		if err != nil {
			return nil, bad("rate", p.Rate, err.Error())
		}
		overall = r
	}
	var rules []*ratelimit.Rule
	seen := map[string]bool{}
	for _, m := range p.Messages {
		if m.Type == "" || m.Type == "overall" || seen[m.Type] {
			return nil, bad("message", strconv.Quote(m.Type), "needs a unique type name other than overall")
		}
		seen[m.Type] = true
		r, err := ratelimit.NewRule(m.Type, m.Rate, m.Burst)
		if err != nil {
			return nil, bad("message "+m.Type+" rate", m.Rate, err.Error())
		}
		rules = append(rules, r)
	}
	if overall == nil && len(rules) == 0 {
		return nil, bad("rate", 0, "a profile needs an overall rate or a message limit")
	}
	max := p.MaxPeers
	if max == 0 {
		max = defaultMaxPeers
	}
	return ratelimit.NewProfile(p.Name, overall, rules, max), nil
}

// covers reports whether the profile applies to a client address and, if
// it selects by a placeholder, to the request whose placeholders repl
// holds.
func (p *ProfileConfig) covers(a netip.Addr, repl *caddy.Replacer) bool {
	if p.Select != nil && !p.Select.matches(repl.ReplaceAll(p.Select.Placeholder, "")) {
		return false
	}
	if len(p.prefixes) == 0 {
		return true
	}
	a = a.Unmap()
	for _, pfx := range p.prefixes {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// unmarshalProfile reads
//
//	profile <name> {
//		peer <placeholder>
//		missing_peer fallback | refuse
//		select <placeholder> <value...>
//		peer_cidr <cidr...>
//		rate <per second> [burst]
//		message <type> {
//			match { <matchers> }      # HTTP only
//			rate <per second> [burst]
//			dynamic
//		}
//		action reject [<status> [<message>]] | drop
//		max_peers <n>
//		dynamic                   # throttle the overall rate dynamically too
//	}
//
// matcher parses a message's match block (HTTP) or its other options
// (layer4); it returns false for an option it does not know.
func unmarshalProfile(d *caddyfile.Dispenser, matcher messageOption) (ProfileConfig, error) {
	if !d.NextArg() {
		return ProfileConfig{}, d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return ProfileConfig{}, d.ArgErr()
	}
	return unmarshalProfileBlock(d, name, matcher)
}

// messageOption parses one adapter-specific option of a message block
// (HTTP: match { … }); it returns false for an option it does not know.
type messageOption func(*caddyfile.Dispenser, *MessageConfig) (bool, error)

// unmarshalProfileBlock reads the block of a profile (or egress group)
// whose name was read already.
func unmarshalProfileBlock(d *caddyfile.Dispenser, name string, matcher messageOption) (ProfileConfig, error) {
	p := ProfileConfig{Name: name}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "peer":
			if !d.NextArg() {
				return p, d.ArgErr()
			}
			p.Peer = d.Val()
		case "missing_peer":
			if !d.Args(&p.MissingPeer) || d.NextArg() {
				return p, d.ArgErr()
			}
		case "select":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return p, d.Errf("peer_rate_limit: profile %s: select: want select <placeholder> <value...>", p.Name)
			}
			p.Select = &SelectConfig{Placeholder: args[0], Values: args[1:]}
		case "peer_cidr":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return p, d.ArgErr()
			}
			p.PeerCIDRs = append(p.PeerCIDRs, args...)
		case "rate":
			r, b, err := rateArgs(d)
			if err != nil {
				return p, err
			}
			p.Rate, p.Burst = r, b
		case "message":
			m := MessageConfig{}
			if !d.NextArg() {
				return p, d.ArgErr()
			}
			m.Type = d.Val()
			for mn := d.Nesting(); d.NextBlock(mn); {
				switch d.Val() {
				case "rate":
					r, b, err := rateArgs(d)
					if err != nil {
						return p, err
					}
					m.Rate, m.Burst = r, b
				case "dynamic":
					m.Dynamic = true
				default:
					ok, err := matcher(d, &m)
					if err != nil {
						return p, err
					}
					if !ok {
						return p, d.Errf("peer_rate_limit: message %s: unknown option %q", m.Type, d.Val())
					}
				}
			}
			p.Messages = append(p.Messages, m)
		case "action":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return p, d.ArgErr()
			}
			p.Action = args[0]
			switch {
			case args[0] == "drop" && len(args) == 1:
			case args[0] == "reject" && len(args) <= 3:
				if len(args) > 1 {
					s, err := strconv.Atoi(args[1])
					if err != nil {
						return p, d.Errf("peer_rate_limit: action reject %q: the status must be a number", args[1])
					}
					p.Status = s
				}
				if len(args) > 2 {
					p.Message = args[2]
				}
			default:
				return p, d.Errf("peer_rate_limit: action %q: want reject [status [message]] or drop", args)
			}
		case "dynamic":
			if d.NextArg() {
				return p, d.ArgErr()
			}
			p.Dynamic = true
		case "max_peers":
			var s string
			if !d.Args(&s) {
				return p, d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return p, d.Errf("peer_rate_limit: max_peers %q: want a whole number of at least 1", s)
			}
			p.MaxPeers = n
		default:
			return p, d.Errf("peer_rate_limit: profile %s: unknown option %q", p.Name, opt)
		}
	}
	return p, nil
}

// rateArgs reads "<per second> [burst]", with an optional "/s" suffix.
func rateArgs(d *caddyfile.Dispenser) (float64, int, error) {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return 0, 0, d.ArgErr()
	}
	s := args[0]
	if len(s) > 2 && s[len(s)-2:] == "/s" {
		s = s[:len(s)-2]
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r > 0) {
		return 0, 0, d.Errf("peer_rate_limit: rate %q: want a positive number per second", args[0])
	}
	b := 0
	if len(args) == 2 {
		if b, err = strconv.Atoi(args[1]); err != nil || b < 1 {
			return 0, 0, d.Errf("peer_rate_limit: burst %q: want a whole number of at least 1", args[1])
		}
	}
	return r, b, nil
}
