// Package peerratelimit provides the peer_rate_limit handlers for Caddy HTTP
// (http.handlers.peer_rate_limit) and caddy-l4 (layer4.handlers.peer_rate_limit):
// Cisco vDRA's peer and message rate limiting, static and dynamic. The
// algorithm lives in internal/ratelimit; this package adapts it.
package peerratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
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
	// Cluster makes the overall rate a limit for the whole cluster of
	// replicas sharing a Redis store, divided among them by demand.
	Cluster *ClusterConfig `json:"cluster,omitempty"`

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
	if p.Name == "" {
		return nil, fmt.Errorf("peer_rate_limit: a profile needs a name")
	}
	if err := p.checkOptions(); err != nil {
		return nil, err
	}
	if err := p.checkSelect(); err != nil {
		return nil, err
	}
	if err := p.parsePeerCIDRs(); err != nil {
		return nil, err
	}
	overall, messages, err := p.rules()
	if err != nil {
		return nil, err
	}
	return ratelimit.NewProfile(p.Name, overall, messages, cmp.Or(p.MaxPeers, defaultMaxPeers)), nil
}

// bad is the error of option opt of the profile set to v.
func (p *ProfileConfig) bad(opt string, v any, why string) error {
	return fmt.Errorf("peer_rate_limit: profile %s: %s %v: %s", p.Name, opt, v, why)
}

// checkOptions checks the profile's single-valued options.
func (p *ProfileConfig) checkOptions() error {
	switch p.Action {
	case "", "reject", "drop":
	default:
		return p.bad("action", strconv.Quote(p.Action), "want reject or drop")
	}
	switch p.MissingPeer {
	case "", missingFallback, missingRefuse:
	default:
		return p.bad("missing_peer", strconv.Quote(p.MissingPeer), "want fallback or refuse")
	}
	if p.Status != 0 && (p.Status < 400 || p.Status > 599) {
		return p.bad("status", p.Status, "want a 4xx or 5xx code")
	}
	if p.Rate < 0 {
		return p.bad("rate", p.Rate, "must be positive")
	}
	if p.MaxPeers < 0 {
		return p.bad("max_peers", p.MaxPeers, "must be positive")
	}
	return nil
}

// checkSelect checks the select option: a placeholder and values or
// patterns.
func (p *ProfileConfig) checkSelect() error {
	sel := p.Select
	if sel == nil {
		return nil
	}
	if !strings.Contains(sel.Placeholder, "{") || len(sel.Values) == 0 {
		return p.bad("select", strconv.Quote(sel.Placeholder), "want a placeholder and at least one value")
	}
	for _, v := range sel.Values {
		if _, err := path.Match(v, ""); err != nil || v == "" {
			return p.bad("select "+sel.Placeholder, strconv.Quote(v), "not a value or pattern")
		}
	}
	return nil
}

// parsePeerCIDRs sets the ranges covers matches from PeerCIDRs (a bare
// IP is its one-address range).
func (p *ProfileConfig) parsePeerCIDRs() error {
	p.prefixes = p.prefixes[:0]
	for _, c := range p.PeerCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			a, err := netip.ParseAddr(c)
			if err != nil {
				return p.bad("peer_cidr", c, "not a CIDR or IP")
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		p.prefixes = append(p.prefixes, pfx.Masked())
	}
	return nil
}

// rules returns the overall rule (nil: none) and the message rules, in
// order; a profile needs at least one.
func (p *ProfileConfig) rules() (*ratelimit.Rule, []*ratelimit.Rule, error) {
	var overall *ratelimit.Rule
	if p.Rate > 0 {
		r, err := ratelimit.NewRule("overall", p.Rate, p.Burst)
		if err != nil {
			return nil, nil, p.bad("rate", p.Rate, err.Error())
		}
		overall = r
	}
	var messages []*ratelimit.Rule
	seen := map[string]bool{}
	for _, m := range p.Messages {
		if m.Type == "" || m.Type == "overall" || seen[m.Type] {
			return nil, nil, p.bad("message", strconv.Quote(m.Type), "needs a unique type name other than overall")
		}
		seen[m.Type] = true
		r, err := ratelimit.NewRule(m.Type, m.Rate, m.Burst)
		if err != nil {
			return nil, nil, p.bad("message "+m.Type+" rate", m.Rate, err.Error())
		}
		messages = append(messages, r)
	}
	if overall == nil && len(messages) == 0 {
		return nil, nil, p.bad("rate", 0, "a profile needs an overall rate or a message limit")
	}
	return overall, messages, nil
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

// unmarshalProfile reads, at a handler's "profile" option,
//
//	profile <name> {
//		peer <placeholder>
//		missing_peer fallback | refuse
//		select <placeholder> <value...>
//		peer_cidr <cidr...>                 # may repeat: the ranges add up
//		rate <per second> [burst]
//		message <type> {                    # may repeat, once per type
//			match { <matchers> }        # HTTP only
//			rate <per second> [burst]
//			dynamic
//		}
//		action reject [<status> [<message>]] | drop
//		max_peers <n>
//		dynamic                             # throttle the overall rate dynamically too
//		cluster redis <store> { … }         # the overall rate is cluster-wide (see unmarshalCluster)
//	}
//
// A profile name is given once per handler; every option other than
// peer_cidr and message is given once per profile. matcher parses a
// message's adapter-specific options (HTTP: match); it returns false for
// an option it does not know.
func unmarshalProfile(o *cfparse.Block, matcher messageOption) (ProfileConfig, error) {
	args, err := o.BlockArgs(1, 1)
	if err != nil {
		return ProfileConfig{}, err
	}
	if err := o.OnceFor(args[0]); err != nil {
		return ProfileConfig{}, err
	}
	return unmarshalProfileBlock(o.Sub(), args[0], matcher)
}

// messageOption parses one adapter-specific option of a message block
// (HTTP: match { … }); it returns false for an option it does not know.
type messageOption func(*cfparse.Block, *MessageConfig) (bool, error)

// unmarshalProfileBlock reads the block of a profile (or egress group)
// whose name was read already.
func unmarshalProfileBlock(o *cfparse.Block, name string, matcher messageOption) (ProfileConfig, error) {
	p := ProfileConfig{Name: name}
	for o.Next() {
		var err error
		switch o.Name() {
		case "peer":
			p.Peer, err = o.String()
		case "missing_peer":
			p.MissingPeer, err = o.String()
		case "select":
			var args []string
			if err = o.Once(); err == nil {
				if args, err = o.Args(2, cfparse.Many); err == nil {
					p.Select = &SelectConfig{Placeholder: args[0], Values: args[1:]}
				}
			}
		case "peer_cidr":
			var more []string
			more, err = o.List()
			p.PeerCIDRs = append(p.PeerCIDRs, more...)
		case "rate":
			if err = o.Once(); err == nil {
				p.Rate, p.Burst, err = rateArgs(o)
			}
		case "message":
			var m MessageConfig
			if m, err = unmarshalMessage(o, matcher); err == nil {
				p.Messages = append(p.Messages, m)
			}
		case "action":
			err = p.unmarshalAction(o)
		case "dynamic":
			err = o.Flag()
			p.Dynamic = err == nil
		case "max_peers":
			p.MaxPeers, err = o.Int(1, math.MaxInt)
		case "cluster":
			p.Cluster, err = unmarshalCluster(o)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return p, err
		}
	}
	return p, nil
}

// unmarshalMessage reads "message <type> { … }", once per type.
func unmarshalMessage(o *cfparse.Block, matcher messageOption) (MessageConfig, error) {
	args, err := o.BlockArgs(1, 1)
	if err != nil {
		return MessageConfig{}, err
	}
	if err := o.OnceFor(args[0]); err != nil {
		return MessageConfig{}, err
	}
	m := MessageConfig{Type: args[0]}
	for sub := o.Sub(); sub.Next(); {
		switch sub.Name() {
		case "rate":
			if err = sub.Once(); err == nil {
				m.Rate, m.Burst, err = rateArgs(sub)
			}
		case "dynamic":
			err = sub.Flag()
			m.Dynamic = err == nil
		default:
			var ok bool
			if ok, err = matcher(sub, &m); err == nil && !ok {
				err = sub.Unknown()
			}
		}
		if err != nil {
			return m, err
		}
	}
	return m, nil
}

// unmarshalAction reads "action reject [<status> [<message>]] | drop".
func (p *ProfileConfig) unmarshalAction(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(1, 3)
	if err != nil {
		return err
	}
	switch {
	case args[0] == "drop" && len(args) == 1:
	case args[0] == "reject":
		if len(args) > 1 {
			// 0 is the default status: layer4 configs write it to give
			// a message with the status that layer4 ignores.
			s, err := cfparse.Int(args[1], 0, 599)
			if err != nil || (s != 0 && s < 400) {
				return o.Errf("reject status %q: want 0 (the default) or a whole number from 400 to 599", args[1])
			}
			p.Status = s
		}
		if len(args) > 2 {
			p.Message = args[2]
		}
	default:
		return o.Invalid(strings.Join(args, " "), errors.New("want reject [<status> [<message>]] or drop"))
	}
	p.Action = args[0]
	return nil
}

// rateArgs reads "<per second> [burst]" (the rate may end in "/s").
func rateArgs(o *cfparse.Block) (float64, int, error) {
	args, err := o.Args(1, 2)
	if err != nil {
		return 0, 0, err
	}
	r, err := cfparse.Float(strings.TrimSuffix(args[0], "/s"), 0, math.Inf(1))
	if err != nil || r == 0 {
		return 0, 0, o.Invalid(args[0], errors.New("want a positive number per second"))
	}
	b := 0
	if len(args) == 2 {
		if b, err = cfparse.Int(args[1], 1, math.MaxInt); err != nil {
			return 0, 0, o.Errf("burst %q: %v", args[1], err)
		}
	}
	return r, b, nil
}
