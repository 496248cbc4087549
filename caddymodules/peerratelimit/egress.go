package peerratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/internal/wrapped"
)

func init() {
	caddy.RegisterModule(EgressTransport{})
}

// EgressTransport limits requests per upstream group at egress: it wraps
// reverse_proxy's transport, so it runs after the load-balancing policy has
// chosen the upstream and just before the request is forwarded to it (to
// the PCRF peer group, in a Diameter deployment). A refused request
// is answered by the transport itself (status, message, Retry-After; the
// proxy passes that on and does not retry) or dropped (the client's
// connection closes, nothing written).
//
// Placeholders: {http.peer_rate_limit.egress.verdict}, {…profile} (the
// group), {…message_type}, {…limit}.
type EgressTransport struct {
	// Name labels metrics and the admin API and keys the state kept across
	// reloads, as for the handlers. Default: "http-egress-<config hash>".
	Name string `json:"name,omitempty"`
	// Groups are profiles whose key is the group: every upstream listed in
	// a group shares its limits.
	Groups  []EgressGroup  `json:"groups"`
	Dynamic *DynamicConfig `json:"dynamic,omitempty"`
	// TransportRaw is the wrapped transport; default "http".
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`

	wrapped.Inner
	byAddr   map[string]*httpProfile // upstream host:port → its group
	profiles []*httpProfile
	lease    *lease
	orca     *orcaFeed // dynamic source orca: where the answers' reports go
}

// EgressGroup is an upstream group and its limits.
type EgressGroup struct {
	ProfileConfig
	// Upstreams are the dial addresses (host:port) in the group.
	Upstreams []string `json:"upstreams"`
}

// CaddyModule returns the Caddy module information.
func (EgressTransport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.peer_rate_limit",
		New: func() caddy.Module { return new(EgressTransport) },
	}
}

// Provision loads the wrapped transport and the groups.
func (t *EgressTransport) Provision(ctx caddy.Context) error {
	fp := fingerprint(t)
	if t.Name == "" {
		name, err := defaultName("http-egress", t)
		if err != nil {
			return err
		}
		t.Name = name
	}
	if err := t.Load(ctx, t, &t.TransportRaw, "peer_rate_limit", "peer_rate_limit"); err != nil {
		return err
	}
	cfgs := make([]ProfileConfig, len(t.Groups))
	for i, g := range t.Groups {
		if g.Peer != "" || len(g.PeerCIDRs) > 0 || g.MissingPeer != "" || g.Select != nil {
			return fmt.Errorf("peer_rate_limit: group %s: peer, missing_peer, select and peer_cidr do not apply to egress groups", g.Name)
		}
		if len(g.Upstreams) == 0 {
			return fmt.Errorf("peer_rate_limit: group %s lists no upstream", g.Name)
		}
		cfgs[i] = g.ProfileConfig
		if cfgs[i].Status == 0 {
			cfgs[i].Status = http.StatusServiceUnavailable
		}
	}
	profiles, engines, dynamicRules, err := provisionHTTPProfiles(ctx, cfgs)
	if err != nil {
		return err
	}
	t.profiles = profiles
	t.byAddr = map[string]*httpProfile{}
	for i, g := range t.Groups {
		for _, u := range g.Upstreams {
			if _, _, err := net.SplitHostPort(u); err != nil {
				return fmt.Errorf("peer_rate_limit: group %s: upstream %q: want host:port", g.Name, u)
			}
			if other, dup := t.byAddr[u]; dup {
				return fmt.Errorf("peer_rate_limit: upstream %s is in groups %s and %s", u, other.cfg.Name, g.Name)
			}
			t.byAddr[u] = profiles[i]
		}
	}
	t.lease, err = provisionState(ctx, "http-egress", t.Name, fp, cfgs, engines, t.Dynamic, dynamicRules, t)
	if err != nil {
		return err
	}
	if d := t.lease.gen.dynamic; d != nil {
		t.orca = d.orca
	}
	return nil
}

// Cleanup lets go of the shared state and cleans up the wrapped transport.
func (t *EgressTransport) Cleanup() error {
	if t.lease != nil {
		t.lease.release()
	}
	return t.CleanupInner()
}

// RoundTrip limits the request by the group of the upstream it is about to
// be sent to, then forwards it with the wrapped transport.
func (t *EgressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	di, ok := reverseproxy.GetDialInfo(req.Context())
	var p *httpProfile
	if ok {
		p = t.byAddr[di.Address]
	}
	if p == nil {
		return t.forward(req, di.Address)
	}
	repl, _ := req.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	verdict, limit, err := p.decide(req, p.cfg.Name, repl, egressPlaceholders)
	if err != nil {
		return nil, err
	}
	switch verdict {
	case admitted:
		return t.forward(req, di.Address)
	case dropped:
		panic(http.ErrAbortHandler)
	}
	status, body, retry := p.rejection(limit)
	if isGRPC(req.Header) {
		// Trailers-only: a known empty body (ContentLength 0, not -1)
		// makes reverse_proxy write the headers and end the stream in one
		// frame, rather than flush them ahead of an empty body.
		h := http.Header{}
		grpcRefusal(h, req.Header.Get("Content-Type"), limit, body)
		return &http.Response{
			Status: "200 OK", StatusCode: http.StatusOK,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: h, Body: http.NoBody, ContentLength: 0, Request: req,
		}, nil
	}
	return &http.Response{
		Status:     strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode: status,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type": {"text/plain; charset=utf-8"},
			"Retry-After":  {strconv.Itoa(retry)},
		},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// forward sends the request with the wrapped transport; with the orca
// source, the answer's headers go to the transport's ORCA feed, keyed by
// the upstream's dial address.
func (t *EgressTransport) forward(req *http.Request, upstream string) (*http.Response, error) {
	resp, err := t.Forward(req)
	if f := t.orca; f != nil && err == nil {
		f.observe(resp.Header, upstream, time.Now().UnixNano())
	}
	return resp, err
}

// UnmarshalCaddyfile reads
//
//	transport peer_rate_limit {
//		name <name>
//		group <name> <upstream host:port...> {
//			rate <per second> [burst]
//			message <type> { match { … } rate <n> [burst] dynamic }
//			action reject [<status> [<message>]] | drop      # default 503
//			max_peers <n>
//		}
//		dynamic { … }
//		transport <name> { … }     # the wrapped transport, default http
//	}
func (t *EgressTransport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "peer_rate_limit: transport", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		switch o.Name() {
		case "name":
			t.Name, err = o.String()
		case "group":
			err = t.unmarshalGroup(o)
		case "dynamic":
			t.Dynamic, err = UnmarshalDynamic(o)
		case "transport":
			err = t.unmarshalTransport(o)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalGroup reads "group <name> <upstream...> { … }", once per name.
func (t *EgressTransport) unmarshalGroup(o *cfparse.Block) error {
	args, err := o.BlockArgs(2, cfparse.Many)
	if err != nil {
		return err
	}
	if err := o.OnceFor(args[0]); err != nil {
		return err
	}
	p, err := unmarshalProfileBlock(o.Sub(), args[0], httpMatcher)
	if err != nil {
		return err
	}
	t.Groups = append(t.Groups, EgressGroup{ProfileConfig: p, Upstreams: args[1:]})
	return nil
}

// unmarshalTransport reads "transport <name> { … }", the wrapped transport.
func (t *EgressTransport) unmarshalTransport(o *cfparse.Block) (err error) {
	t.TransportRaw, err = wrapped.Unmarshal(o)
	return err
}

// Interface guards
var (
	_ http.RoundTripper                   = (*EgressTransport)(nil)
	_ caddy.Provisioner                   = (*EgressTransport)(nil)
	_ caddy.CleanerUpper                  = (*EgressTransport)(nil)
	_ caddyfile.Unmarshaler               = (*EgressTransport)(nil)
	_ reverseproxy.TLSTransport           = (*EgressTransport)(nil)
	_ reverseproxy.ProxyProtocolTransport = (*EgressTransport)(nil)
)

// Interface guards: the wrapped transport's abilities pass through.
var (
	_ reverseproxy.TLSTransport           = (*EgressTransport)(nil)
	_ reverseproxy.ProxyProtocolTransport = (*EgressTransport)(nil)
	_ caddy.CleanerUpper                  = (*EgressTransport)(nil)
)
