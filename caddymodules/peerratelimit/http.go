package peerratelimit

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

func init() {
	caddy.RegisterModule(HTTPHandler{})
	httpcaddyfile.RegisterHandlerDirective("peer_rate_limit", parseHTTPCaddyfile)
	// Limit before any authentication or proxying work is spent on a
	// request (the seed: throttle "as soon as the message is received").
	httpcaddyfile.RegisterDirectiveOrder("peer_rate_limit", httpcaddyfile.Before, "basic_auth")
}

// HTTPHandler limits requests per peer and per message type at ingress,
// and rejects (status, message, Retry-After) or drops (closes the
// connection, nothing written) what exceeds them.
//
// Placeholders: {http.peer_rate_limit.verdict} (admitted, rejected,
// dropped), {…profile}, {…message_type}, {…limit} (the limit that refused).
type HTTPHandler struct {
	// Name labels metrics and the admin API. Default "http".
	Name     string          `json:"name,omitempty"`
	Profiles []ProfileConfig `json:"profiles"`
	Dynamic  *DynamicConfig  `json:"dynamic,omitempty"`

	profiles []*httpProfile
	runtime  *runtime
}

type httpProfile struct {
	cfg      *ProfileConfig
	engine   *ratelimit.Profile
	matchers []caddyhttp.MatcherSet // per message, in order
	// counters[message index + 1][verdict]; index 0 is "other".
	counters [][3]prometheus.Counter
}

const (
	admitted = iota
	rejected
	dropped
)

var verdicts = [3]string{"admitted", "rejected", "dropped"}

// CaddyModule returns the Caddy module information.
func (HTTPHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.peer_rate_limit",
		New: func() caddy.Module { return new(HTTPHandler) },
	}
}

// Provision builds the profiles and starts dynamic throttling.
func (h *HTTPHandler) Provision(ctx caddy.Context) error {
	if h.Name == "" {
		h.Name = "http"
	}
	if err := registerMetrics(ctx); err != nil {
		return err
	}
	if len(h.Profiles) == 0 {
		return fmt.Errorf("peer_rate_limit: no profile configured")
	}
	h.profiles = nil
	var engines []*ratelimit.Profile
	var dynamicRules []*ratelimit.Rule
	for i := range h.Profiles {
		pc := &h.Profiles[i]
		engine, err := pc.build()
		if err != nil {
			return err
		}
		hp := &httpProfile{cfg: pc, engine: engine}
		hp.counters = make([][3]prometheus.Counter, len(pc.Messages)+1)
		for j := range hp.counters {
			typ := "other"
			if j > 0 {
				typ = pc.Messages[j-1].Type
			}
			for v, name := range verdicts {
				hp.counters[j][v] = theMetrics.decisions.WithLabelValues(h.Name, pc.Name, typ, name)
			}
		}
		for j := range pc.Messages {
			m := &pc.Messages[j]
			if m.MatchRaw == nil {
				return fmt.Errorf("peer_rate_limit: profile %s: message %s has no match", pc.Name, m.Type)
			}
			mod, err := ctx.LoadModule(m, "MatchRaw")
			if err != nil {
				return fmt.Errorf("peer_rate_limit: profile %s: message %s: loading matchers: %v", pc.Name, m.Type, err)
			}
			var set caddyhttp.MatcherSet
			for _, mm := range mod.(map[string]any) {
				set = append(set, mm)
			}
			hp.matchers = append(hp.matchers, set)
			if m.Dynamic {
				dynamicRules = append(dynamicRules, engine.Message(m.Type))
			}
		}
		h.profiles = append(h.profiles, hp)
		engines = append(engines, engine)
	}
	rt, err := newRuntime(h.Name, "http", engines, h.Dynamic, dynamicRules, ctx.Logger())
	if err != nil {
		return err
	}
	h.runtime = rt
	return nil
}

// Cleanup stops dynamic throttling.
func (h *HTTPHandler) Cleanup() error {
	if h.runtime != nil {
		h.runtime.stop()
	}
	return nil
}

// ServeHTTP applies the first profile that covers the client.
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	clientIP, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	addr, _ := netip.ParseAddr(clientIP)
	var p *httpProfile
	for _, cand := range h.profiles {
		if cand.cfg.covers(addr) {
			p = cand
			break
		}
	}
	if p == nil {
		return next.ServeHTTP(w, r)
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	key := clientIP
	if p.cfg.Peer != "" && repl != nil {
		key = repl.ReplaceAll(p.cfg.Peer, "")
	}
	msg, msgType := 0, ""
	for i, set := range p.matchers {
		ok, err := set.MatchWithError(r)
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if ok {
			msg, msgType = i+1, p.cfg.Messages[i].Type
			break
		}
	}
	ok, limit := p.engine.Decide(key, msgType, time.Now().UnixNano())
	verdict := admitted
	if !ok {
		verdict = rejected
		if p.cfg.Action == "drop" {
			verdict = dropped
		}
	}
	p.counters[msg][verdict].Inc()
	if repl != nil {
		repl.Set("http.peer_rate_limit.verdict", verdicts[verdict])
		repl.Set("http.peer_rate_limit.profile", p.cfg.Name)
		repl.Set("http.peer_rate_limit.message_type", msgType)
		repl.Set("http.peer_rate_limit.limit", limit)
	}
	switch verdict {
	case admitted:
		return next.ServeHTTP(w, r)
	case dropped:
		// Close the connection (HTTP/1) or reset the stream (HTTP/2)
		// without writing anything, as Caddy's own abort does.
		panic(http.ErrAbortHandler)
	}
	rule := p.engine.Overall
	if limit != "overall" {
		rule = p.engine.Message(limit)
	}
	status, body := p.cfg.Status, p.cfg.Message
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	if body == "" {
		body = "rate limit exceeded"
	}
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter(rule)))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, err := w.Write([]byte(body + "\n"))
	return err
}

// retryAfter is the whole seconds until the rule admits again: at least 1.
func retryAfter(r *ratelimit.Rule) int {
	eff := r.Effective()
	if eff <= 0 {
		return 60
	}
	return max(1, int(math.Ceil(1/eff)))
}

// parseHTTPCaddyfile reads
//
//	peer_rate_limit [<matcher>] {
//		name <name>
//		profile <name> { … }     # see unmarshalProfile; message blocks take match { … }
//		dynamic { … }            # see unmarshalDynamic
//	}
func parseHTTPCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var hh HTTPHandler
	err := hh.UnmarshalCaddyfile(h.Dispenser)
	return &hh, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler.
func (h *HTTPHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "name":
			if !d.Args(&h.Name) {
				return d.ArgErr()
			}
		case "profile":
			p, err := unmarshalProfile(d, func(d *caddyfile.Dispenser, m *MessageConfig) (bool, error) {
				if d.Val() != "match" {
					return false, nil
				}
				set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
				if err != nil {
					return true, err
				}
				m.MatchRaw = set
				return true, nil
			})
			if err != nil {
				return err
			}
			h.Profiles = append(h.Profiles, p)
		case "dynamic":
			dc, err := unmarshalDynamic(d)
			if err != nil {
				return err
			}
			h.Dynamic = dc
		default:
			return d.Errf("peer_rate_limit: unknown option %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*HTTPHandler)(nil)
	_ caddy.Provisioner           = (*HTTPHandler)(nil)
	_ caddy.CleanerUpper          = (*HTTPHandler)(nil)
	_ caddyfile.Unmarshaler       = (*HTTPHandler)(nil)
)
