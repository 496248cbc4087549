package peerratelimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

func init() {
	caddy.RegisterModule(HTTPHandler{})
	httpcaddyfile.RegisterHandlerDirective("peer_rate_limit", parseHTTPCaddyfile)
	// Limit before any authentication or proxying work is spent on a
	// request: a request is throttled as soon as it is received.
	httpcaddyfile.RegisterDirectiveOrder("peer_rate_limit", httpcaddyfile.Before, "basic_auth")
}

// HTTPHandler limits requests per peer and per message type at ingress,
// and rejects (status, message, Retry-After) or drops (closes the
// connection, nothing written) what exceeds them.
//
// Placeholders: {http.peer_rate_limit.verdict} (admitted, rejected,
// dropped), {…profile}, {…message_type}, {…limit} (the limit that refused).
type HTTPHandler struct {
	leasedConfig // name (default "http-<config hash>"), profiles, dynamic

	profiles []*httpProfile
	orca     *orcaFeed // dynamic source orca: where the answers' reports go
}

// CaddyModule returns the Caddy module information.
func (HTTPHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.peer_rate_limit",
		New: func() caddy.Module { return new(HTTPHandler) },
	}
}

// Provision builds the profiles and adopts the state kept under the
// handler's name (see leasedConfig.Name).
func (h *HTTPHandler) Provision(ctx caddy.Context) error {
	fp := fingerprint(h)
	if h.Name == "" {
		name, err := defaultName("http", h)
		if err != nil {
			return err
		}
		h.Name = name
	}
	if err := registerMetrics(ctx); err != nil {
		return err
	}
	if len(h.Profiles) == 0 {
		return fmt.Errorf("peer_rate_limit: no profile configured")
	}
	profiles, engines, dynamicRules, err := provisionHTTPProfiles(ctx, h.Profiles)
	if err != nil {
		return err
	}
	h.profiles = profiles
	h.lease, err = provisionState(ctx, "http", h.Name, fp, h.Profiles, engines, h.Dynamic, dynamicRules, h)
	if err != nil {
		return err
	}
	if d := h.lease.gen.dynamic; d != nil {
		h.orca = d.orca
	}
	return nil
}

// ServeHTTP applies the first profile that covers the client.
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	clientIP, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	addr, _ := netip.ParseAddr(clientIP)
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	var p *httpProfile
	for _, cand := range h.profiles {
		if cand.cfg.covers(addr, repl) {
			p = cand
			break
		}
	}
	if p == nil {
		return h.forward(w, r, repl, next)
	}
	verdict, limit := 0, peerLimit
	if key, ok := p.peerKey(repl, clientIP); ok {
		var err error
		if verdict, limit, err = p.decide(r, key, repl, httpPlaceholders); err != nil {
			return err
		}
	} else {
		verdict = p.refuseUnnamed(0, repl, httpPlaceholders)
	}
	switch verdict {
	case admitted:
		return h.forward(w, r, repl, next)
	case dropped:
		// Close the connection (HTTP/1) or reset the stream (HTTP/2)
		// without writing anything, as Caddy's own abort does.
		panic(http.ErrAbortHandler)
	}
	status, body, retry := p.rejection(limit)
	if isGRPC(r.Header) {
		grpcRefusal(w.Header(), r.Header.Get("Content-Type"), limit, body)
		w.WriteHeader(http.StatusOK)
		return nil
	}
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retry))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, err := w.Write([]byte(body))
	return err
}

// forward passes the request on; with the orca source, the answer's
// headers go to the handler's ORCA feed on the way back.
func (h *HTTPHandler) forward(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler) error {
	if f := h.orca; f != nil {
		return serveORCA(f, w, r, repl, next)
	}
	return next.ServeHTTP(w, r)
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
	return h.unmarshalCaddyfile(d, httpMatcher, nil)
}

// httpMatcher parses a message's match { … } block of HTTP matchers, once
// per message (inside it, matchers repeat as Caddy's named matchers do).
func httpMatcher(o *cfparse.Block, m *MessageConfig) (bool, error) {
	if o.Name() != "match" {
		return false, nil
	}
	if err := o.Once(); err != nil {
		return true, err
	}
	set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(o.Dispenser())
	if err != nil {
		return true, err
	}
	m.MatchRaw = set
	return true, nil
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*HTTPHandler)(nil)
	_ caddy.Provisioner           = (*HTTPHandler)(nil)
	_ caddy.CleanerUpper          = (*HTTPHandler)(nil)
	_ caddyfile.Unmarshaler       = (*HTTPHandler)(nil)
)
