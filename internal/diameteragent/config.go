package diameteragent

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/olrshare"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// Config is one generation of the agent's configuration. A reload hands a
// new one to Agent.Update; connections, bindings and counters are kept.
type Config struct {
	Identity
	// Applications the agent advertises in its CER and CEA and routes.
	Applications []Application
	Peers        []PeerConfig
	Groups       []GroupConfig
	Routes       []Route
	// DefaultGroup takes the requests no route matches ("": none, so
	// they get 3003 or 3002).
	DefaultGroup string

	// Watchdog is Tw of RFC 3539 (default 30 s, at least 6 s as the RFC
	// requires).
	Watchdog time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff (default
	// 1 s doubling up to 30 s).
	ReconnectMin, ReconnectMax time.Duration
	// MaxBindings bounds the Session-Id binding table (default 1 000 000);
	// BindingTTL forgets a binding idle that long (default 1 h).
	MaxBindings int
	BindingTTL  time.Duration
	// BindingStore shares the bindings with the agent's other replicas
	// (nil: local only; see bindshare.go).
	BindingStore *diambind.Config
	// ServerRequestTimeout bounds the wait for a downstream peer's answer
	// to a request an upstream server sent (RAR, ASR); default 5 s.
	ServerRequestTimeout time.Duration
	// MaxLength bounds a message (default 65536); longer ones close the
	// connection that sent them.
	MaxLength int
	// Ingress limits requests per downstream peer (keyed by its CER's
	// Origin-Host) and message type, before routing.
	Ingress        *ratelimit.Profile
	IngressRefusal Refusal
	// DOIC turns on overload control and load information (nil: off).
	DOIC *DOIC
	// ReportStore shares the overload reports in force with the agent's
	// other replicas (nil: local only; with DOIC only; see reportshare.go).
	ReportStore *olrshare.Config
}

// PeerConfig is an upstream server in the peer table.
type PeerConfig struct {
	Host    string // its Origin-Host (Destination-Host names it)
	Realm   string
	Address string // host:port the agent dials
	// Applications the agent's CER to this server advertises, by id,
	// each one of the agent's Applications (none: all of them). A CEA
	// sharing none of them leaves the server down (RFC 6733 §5.3).
	Applications []uint32
}

// samePeer reports whether a and b are one server: a reload keeps its
// connection only then.
func samePeer(a, b PeerConfig) bool {
	return a.Host == b.Host && a.Realm == b.Realm && a.Address == b.Address && slices.Equal(a.Applications, b.Applications)
}

// advertised returns the applications the agent's CER to p carries.
func (c *Config) advertised(p PeerConfig) []Application {
	if len(p.Applications) == 0 {
		return c.Applications
	}
	var out []Application
	for _, app := range c.Applications {
		if slices.Contains(p.Applications, app.ID) {
			out = append(out, app)
		}
	}
	return out
}

// Policy picks a server of a group for a request whose session is not
// bound.
type Policy string

const (
	RoundRobin       Policy = "round_robin"
	LeastOutstanding Policy = "least_outstanding"
	// LatencyBucket picks a member in the lowest latency bucket
	// (internal/latency's exponential buckets of BucketWidth) of its
	// answer latency, ties in turn.
	LatencyBucket Policy = "latency_bucket"
	// LeastLoaded spreads new sessions over the members in proportion to
	// their headroom by RFC 8583 Load (65 536 − Load-Value).
	LeastLoaded Policy = "least_loaded"
)

// DefaultBucketWidth is the latency_bucket policy's width: the seeds' 32 ms.
const DefaultBucketWidth = 32 * time.Millisecond

// GroupConfig is a peer group: the servers a route sends to, how a
// server is picked, and the group's bounds and egress limit.
type GroupConfig struct {
	Name   string
	Peers  []string // hosts of the peer table
	Policy Policy   // default round_robin
	// BucketWidth is latency_bucket's bucket width (default 32 ms).
	BucketWidth time.Duration
	// RequestTimeout: a request unanswered this long after the agent
	// received it is answered 3002 (default 3 s).
	RequestTimeout time.Duration
	// MaxPendingPerPeer (default 1024) and MaxPending (the group's, default
	// 4096) bound the requests awaiting an answer.
	MaxPendingPerPeer, MaxPending int
	// Egress limits the group's requests after routing, just before they
	// are forwarded; the key is the group's name.
	Egress  *ratelimit.Profile
	Refusal Refusal
	// Dynamic throttles every rate of Egress by a load figure (nil: none).
	Dynamic *Dynamic
}

// Refusal is what a request refused by a rate limit gets.
type Refusal struct {
	ResultCode   uint32 // default 3002
	ErrorMessage string // default "rate limit exceeded"
	Drop         bool   // no answer at all
}

// Route sends requests for Realm ("*": any realm) and one of Applications
// (none: any application) to Group.
type Route struct {
	Realm        string   `json:"realm"`
	Applications []uint32 `json:"applications,omitempty"`
	Group        string   `json:"group"`
}

// Defaults.
const (
	DefaultWatchdog             = 30 * time.Second
	DefaultReconnectMin         = time.Second
	DefaultReconnectMax         = 30 * time.Second
	DefaultMaxBindings          = 1_000_000
	DefaultBindingTTL           = time.Hour
	DefaultServerRequestTimeout = 5 * time.Second
	DefaultRequestTimeout       = 3 * time.Second
	DefaultMaxPendingPerPeer    = 1024
	DefaultMaxPending           = 4096
	DefaultErrorMessage         = "rate limit exceeded"
	minWatchdog                 = 6 * time.Second // RFC 3539 §3.4.1
)

func (r *Refusal) fill() {
	if r.ResultCode == 0 {
		r.ResultCode = ResultUnableToDeliver
	}
	if r.ErrorMessage == "" {
		r.ErrorMessage = DefaultErrorMessage
	}
}

// Check reports what New and Update would refuse in cfg, naming the
// option and the value.
func Check(cfg Config) error { return cfg.normalize() }

// normalize checks c, naming the option and value at fault, and fills in
// the defaults: the agent's own options, then the peer table, the groups
// (which name peers) and the routes (which name groups).
func (c *Config) normalize() error {
	if err := c.normalizeAgent(); err != nil {
		return err
	}
	hosts, err := c.normalizePeers()
	if err != nil {
		return err
	}
	groups := map[string]bool{}
	for i := range c.Groups {
		g := &c.Groups[i]
		if g.Name == "" || groups[g.Name] {
			return fmt.Errorf("group %d: name %q empty or listed twice", i, g.Name)
		}
		groups[g.Name] = true
		if err := g.normalize(hosts); err != nil {
			return err
		}
	}
	if c.DefaultGroup != "" && !groups[c.DefaultGroup] {
		return fmt.Errorf("default_group %q: no such group", c.DefaultGroup)
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		r.Realm = strings.ToLower(r.Realm)
		if r.Realm == "" || !groups[r.Group] {
			return fmt.Errorf("route %d: realm %q, group %q: want a realm (or *) and a configured group", i, r.Realm, r.Group)
		}
		if err := c.checkRouteApplications(r); err != nil {
			return fmt.Errorf("route %s %s: %w", r.Realm, r.Group, err)
		}
	}
	return nil
}

// normalizeAgent checks and fills in the agent's own options: identity,
// timers, bounds, the ingress refusal and DOIC.
func (c *Config) normalizeAgent() error {
	switch {
	case c.OriginHost == "" || c.OriginRealm == "":
		return fmt.Errorf("origin_host %q, origin_realm %q: both are required", c.OriginHost, c.OriginRealm)
	case len(c.Applications) == 0:
		return fmt.Errorf("applications: none given; the agent advertises and routes the ones listed")
	case c.Watchdog != 0 && c.Watchdog < minWatchdog:
		return fmt.Errorf("watchdog %v: at least %v (RFC 3539)", c.Watchdog, minWatchdog)
	case c.ReconnectMin < 0 || c.ReconnectMax < 0 || (c.ReconnectMax != 0 && c.ReconnectMax < c.ReconnectMin):
		return fmt.Errorf("reconnect backoff %v to %v: want 0 < min ≤ max", c.ReconnectMin, c.ReconnectMax)
	case c.MaxBindings < 0 || c.BindingTTL < 0 || c.ServerRequestTimeout < 0 || c.MaxLength < 0:
		return fmt.Errorf("max_bindings %d, binding_ttl %v, server_request_timeout %v, max_length %d: none may be negative",
			c.MaxBindings, c.BindingTTL, c.ServerRequestTimeout, c.MaxLength)
	case c.MaxLength != 0 && (c.MaxLength < 20 || c.MaxLength > 1<<24):
		return fmt.Errorf("max_length %d: want 20 to 16777216", c.MaxLength)
	}
	def(&c.Watchdog, DefaultWatchdog)
	def(&c.ReconnectMin, DefaultReconnectMin)
	def(&c.ReconnectMax, max(DefaultReconnectMax, c.ReconnectMin))
	def(&c.MaxBindings, DefaultMaxBindings)
	def(&c.BindingTTL, DefaultBindingTTL)
	def(&c.ServerRequestTimeout, DefaultServerRequestTimeout)
	def(&c.MaxLength, 65536)
	c.IngressRefusal.fill()
	if c.DOIC != nil {
		if err := c.DOIC.normalize(); err != nil {
			return err
		}
	}
	return checkRefusal("ingress", c.IngressRefusal)
}

// normalizePeers checks the peer table (hosts lowercased) and returns its
// hosts.
func (c *Config) normalizePeers() (map[string]bool, error) {
	hosts := map[string]bool{}
	for i := range c.Peers {
		p := &c.Peers[i]
		p.Host = strings.ToLower(p.Host)
		if p.Host == "" || p.Realm == "" {
			return nil, fmt.Errorf("peer %d: host %q, realm %q: both are required", i, p.Host, p.Realm)
		}
		if _, _, err := net.SplitHostPort(p.Address); err != nil {
			return nil, fmt.Errorf("peer %s: address %q: want host:port", p.Host, p.Address)
		}
		if hosts[p.Host] || p.Host == strings.ToLower(c.OriginHost) {
			return nil, fmt.Errorf("peer %s: host listed twice or the agent's own", p.Host)
		}
		hosts[p.Host] = true
		for _, app := range p.Applications {
			if !c.serves(app) {
				return nil, fmt.Errorf("peer %s: application %d: not among the agent's applications", p.Host, app)
			}
		}
	}
	return hosts, nil
}

// normalize checks a group whose members must be among hosts (lowercased
// in place) and fills in its defaults.
func (g *GroupConfig) normalize(hosts map[string]bool) error {
	switch {
	case len(g.Peers) == 0:
		return fmt.Errorf("group %s: peers: none given", g.Name)
	case g.Policy != "" && g.Policy != RoundRobin && g.Policy != LeastOutstanding && g.Policy != LatencyBucket && g.Policy != LeastLoaded:
		return fmt.Errorf("group %s: policy %q: want round_robin, least_outstanding, latency_bucket or least_loaded", g.Name, g.Policy)
	case g.BucketWidth < 0:
		return fmt.Errorf("group %s: bucket_width %v: must be positive", g.Name, g.BucketWidth)
	case g.RequestTimeout < 0 || g.MaxPending < 0 || g.MaxPendingPerPeer < 0:
		return fmt.Errorf("group %s: request_timeout %v, max_pending %d, max_pending_per_peer %d: none may be negative",
			g.Name, g.RequestTimeout, g.MaxPending, g.MaxPendingPerPeer)
	}
	for j, h := range g.Peers {
		g.Peers[j] = strings.ToLower(h)
		if !hosts[g.Peers[j]] {
			return fmt.Errorf("group %s: peer %q is not in the peer table", g.Name, h)
		}
	}
	def(&g.Policy, RoundRobin)
	def(&g.BucketWidth, DefaultBucketWidth)
	def(&g.RequestTimeout, DefaultRequestTimeout)
	def(&g.MaxPendingPerPeer, DefaultMaxPendingPerPeer)
	def(&g.MaxPending, DefaultMaxPending)
	g.Refusal.fill()
	if err := checkRefusal("group "+g.Name, g.Refusal); err != nil {
		return err
	}
	if d := g.Dynamic; d != nil {
		switch {
		case g.Egress == nil:
			return fmt.Errorf("group %s: dynamic: no egress limit to throttle", g.Name)
		case d.Source == nil || d.Controller == nil || d.Interval < 0:
			return fmt.Errorf("group %s: dynamic: a load source, a threshold table and a positive interval are needed", g.Name)
		}
		def(&d.Interval, 5*time.Second)
	}
	return nil
}

// serves reports whether app is one of the agent's applications.
func (c *Config) serves(app uint32) bool {
	return slices.ContainsFunc(c.Applications, func(a Application) bool { return a.ID == app || a.ID == relayApp })
}

// checkRouteApplications refuses a route for an application the agent does
// not advertise (no peer would send it), or one a member of its group was
// not offered in the agent's CER (it would be sent requests it never
// agreed to serve).
func (c *Config) checkRouteApplications(r *Route) error {
	gi := slices.IndexFunc(c.Groups, func(g GroupConfig) bool { return g.Name == r.Group })
	for _, app := range r.Applications {
		if !c.serves(app) {
			return fmt.Errorf("application %d: not among the agent's applications", app)
		}
		for _, h := range c.Groups[gi].Peers {
			pi := slices.IndexFunc(c.Peers, func(p PeerConfig) bool { return p.Host == h })
			if apps := c.Peers[pi].Applications; len(apps) > 0 && !slices.Contains(apps, app) {
				return fmt.Errorf("application %d: peer %s of the group does not list it in its applications", app, h)
			}
		}
	}
	return nil
}

func checkRefusal(where string, r Refusal) error {
	if r.ResultCode < 1000 || r.ResultCode > 5999 {
		return fmt.Errorf("%s: result_code %d: want a Diameter result code, 1000-5999", where, r.ResultCode)
	}
	return nil
}

func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
