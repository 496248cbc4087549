package diameteragent

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/diameteragent"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// PeerConfig is an upstream server of the peer table.
type PeerConfig struct {
	// Host is the server's Origin-Host (what Destination-Host names).
	Host  string `json:"host"`
	Realm string `json:"realm"`
	// Address is the host:port the agent dials.
	Address string `json:"address"`
	// Applications the agent's CER to this server advertises, by id: each
	// one of the agent's applications (default: all of them).
	Applications []uint32 `json:"applications,omitempty"`
}

// GroupConfig is a peer group.
type GroupConfig struct {
	Name  string   `json:"name"`
	Peers []string `json:"peers"`
	// Policy: round_robin (default), least_outstanding, latency_bucket or
	// least_loaded (by RFC 8583 Load).
	Policy string `json:"policy,omitempty"`
	// BucketWidth is latency_bucket's bucket width (default 32ms).
	BucketWidth caddy.Duration `json:"bucket_width,omitempty"`
	// RequestTimeout: a request unanswered this long after the agent
	// received it is answered 3002 (default 3 s).
	RequestTimeout    caddy.Duration `json:"request_timeout,omitempty"`
	MaxPending        int            `json:"max_pending,omitempty"`          // default 4096
	MaxPendingPerPeer int            `json:"max_pending_per_peer,omitempty"` // default 1024
	// Egress limits the group's requests after routing, just before
	// forwarding.
	Egress *LimitConfig `json:"egress,omitempty"`
	// Dynamic throttles every rate of Egress by a load figure, in
	// peer_rate_limit's shape.
	Dynamic *DynamicConfig `json:"dynamic,omitempty"`
}

// RouteConfig sends requests for Realm ("*": any) and one of
// Applications (none: any) to Group.
type RouteConfig struct {
	Realm        string   `json:"realm"`
	Applications []uint32 `json:"applications,omitempty"`
	Group        string   `json:"group"`
}

// LimitConfig is a rate-limit profile in peer_rate_limit's shape (rate,
// burst, messages, max_peers, action) with the Diameter refusal.
type LimitConfig struct {
	// Rate is the overall limit per key in requests per second (0: none).
	Rate  float64 `json:"rate,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// Messages limit message types (gx-ccr-i, gy-ccr-u, …); others are
	// subject to Rate only.
	Messages []MessageConfig `json:"messages,omitempty"`
	// MaxPeers bounds the keys tracked (default 100000).
	MaxPeers int `json:"max_peers,omitempty"`
	// Action past a limit: reject (default: answered ResultCode with
	// ErrorMessage) or drop (no answer).
	Action       string `json:"action,omitempty"`
	ResultCode   uint32 `json:"result_code,omitempty"`   // default 3002
	ErrorMessage string `json:"error_message,omitempty"` // default "rate limit exceeded"
}

// MessageConfig is a message type's limit.
type MessageConfig struct {
	Type  string  `json:"type"`
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst,omitempty"`
}

const defaultMaxPeers = 100_000

// build validates l (where names it in errors) and returns its engine
// profile and refusal.
func (l *LimitConfig) build(where string) (*ratelimit.Profile, diameteragent.Refusal, error) {
	var ref diameteragent.Refusal
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("diameter_agent: %s: %s %v: %s", where, opt, v, why)
	}
	switch l.Action {
	case "", "reject":
	case "drop":
		ref.Drop = true
	default:
		return nil, ref, bad("action", fmt.Sprintf("%q", l.Action), "want reject or drop")
	}
	if l.ResultCode != 0 && (l.ResultCode < 1000 || l.ResultCode > 5999) {
		return nil, ref, bad("result_code", l.ResultCode, "want a Diameter result code, 1000-5999")
	}
	if l.MaxPeers < 0 {
		return nil, ref, bad("max_peers", l.MaxPeers, "must be positive")
	}
	ref.ResultCode, ref.ErrorMessage = l.ResultCode, l.ErrorMessage
	var overall *ratelimit.Rule
	if l.Rate != 0 || l.Burst != 0 {
		r, err := ratelimit.NewRule("overall", l.Rate, l.Burst)
		if err != nil {
			return nil, ref, bad("rate", l.Rate, err.Error())
		}
		overall = r
	}
	var msgs []*ratelimit.Rule
	seen := map[string]bool{}
	for _, m := range l.Messages {
		if m.Type == "" || seen[m.Type] {
			return nil, ref, bad("message", fmt.Sprintf("%q", m.Type), "empty or given twice")
		}
		seen[m.Type] = true
		r, err := ratelimit.NewRule(m.Type, m.Rate, m.Burst)
		if err != nil {
			return nil, ref, bad("message "+m.Type, m.Rate, err.Error())
		}
		msgs = append(msgs, r)
	}
	if overall == nil && len(msgs) == 0 {
		return nil, ref, fmt.Errorf("diameter_agent: %s: no rate and no message limit given", where)
	}
	maxPeers := l.MaxPeers
	if maxPeers == 0 {
		maxPeers = defaultMaxPeers
	}
	return ratelimit.NewProfile(where, overall, msgs, maxPeers), ref, nil
}

// profileCache hands out the same engine profile for an unchanged limit
// across reloads, so its buckets (and what a client has spent) carry over.
type profileCache map[string]*ratelimit.Profile

func (c profileCache) get(prev profileCache, where string, l *LimitConfig) (*ratelimit.Profile, diameteragent.Refusal, error) {
	p, ref, err := l.build(where)
	if err != nil {
		return nil, ref, err
	}
	b, _ := json.Marshal(l)
	key := where + "\x00" + string(b)
	if old := prev[key]; old != nil {
		p = old
	}
	c[key] = p
	return p, ref, nil
}

// engineConfig validates h's options and returns the engine's
// configuration; the engine checks the rest (naming option and value).
func (h *Handler) engineConfig(prev, next profileCache) (diameteragent.Config, error) {
	c := diameteragent.Config{
		Identity: diameteragent.Identity{OriginHost: h.OriginHost, OriginRealm: h.OriginRealm,
			VendorID: h.VendorID, ProductName: h.ProductName},
		Applications: h.Applications, DefaultGroup: h.DefaultGroup,
		Watchdog: time.Duration(h.Watchdog), ReconnectMin: time.Duration(h.ReconnectMin), ReconnectMax: time.Duration(h.ReconnectMax),
		MaxBindings: h.MaxBindings, BindingTTL: time.Duration(h.BindingTTL),
		ServerRequestTimeout: time.Duration(h.ServerRequestTimeout), MaxLength: h.MaxLength,
		BindingStore: h.store, ReportStore: h.reports,
	}
	if c.ProductName == "" {
		c.ProductName = "edgesteer"
	}
	if len(h.HostIPAddresses) == 0 {
		return c, fmt.Errorf("diameter_agent: host_ip_address: none given; the CER and CEA must carry one (RFC 6733 §5.3)")
	}
	for _, s := range h.HostIPAddresses {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("diameter_agent: host_ip_address %q: not an IP address", s)
		}
		c.HostIPAddresses = append(c.HostIPAddresses, ip)
	}
	for _, p := range h.Peers {
		c.Peers = append(c.Peers, diameteragent.PeerConfig{Host: p.Host, Realm: p.Realm, Address: p.Address,
			Applications: append([]uint32(nil), p.Applications...)})
	}
	for _, g := range h.Groups {
		gc := diameteragent.GroupConfig{Name: g.Name, Peers: append([]string(nil), g.Peers...),
			Policy: diameteragent.Policy(g.Policy), BucketWidth: time.Duration(g.BucketWidth), RequestTimeout: time.Duration(g.RequestTimeout),
			MaxPending: g.MaxPending, MaxPendingPerPeer: g.MaxPendingPerPeer}
		if g.Egress != nil {
			var err error
			if gc.Egress, gc.Refusal, err = next.get(prev, "group "+g.Name+": egress", g.Egress); err != nil {
				return c, err
			}
		}
		if g.Dynamic != nil {
			var err error
			if gc.Dynamic, err = buildDynamic(g.Name, g.Dynamic); err != nil {
				return c, err
			}
		}
		c.Groups = append(c.Groups, gc)
	}
	for _, r := range h.Routes {
		c.Routes = append(c.Routes, diameteragent.Route{Realm: r.Realm, Applications: r.Applications, Group: r.Group})
	}
	if h.DOIC != nil {
		var err error
		if c.DOIC, err = h.DOIC.build(); err != nil {
			return c, err
		}
	}
	if h.Ingress != nil {
		var err error
		if c.Ingress, c.IngressRefusal, err = next.get(prev, "ingress", h.Ingress); err != nil {
			return c, err
		}
	}
	return c, nil
}

// validate checks h as Provision would, without connecting anywhere.
func (h *Handler) validate() error {
	cfg, err := h.engineConfig(nil, profileCache{})
	if err != nil {
		return err
	}
	a, err := diameteragent.New(cfg, diameteragent.Options{})
	if err != nil {
		return fmt.Errorf("diameter_agent %s: %w", h.Name, err)
	}
	a.Close()
	return nil
}
