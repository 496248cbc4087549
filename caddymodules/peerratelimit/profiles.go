package peerratelimit

import (
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// profile is a provisioned profile: its config and engine, which counts
// its decisions by message index (0: other; i+1: cfg.Messages[i]).
type profile struct {
	cfg    *ProfileConfig
	engine *ratelimit.Profile
	// Placeholder values, boxed once: storing a string in the replacer
	// would allocate on every request. types[0] is "" (other).
	nameVal  any
	typeVals []any
}

// httpProfile adds the HTTP matchers of its message types.
type httpProfile struct {
	*profile
	matchers []caddyhttp.MatcherSet // per message, in order
}

// The verdicts, as decide returns them.
const (
	admitted = int(ratelimit.Admitted)
	rejected = int(ratelimit.Rejected)
	dropped  = int(ratelimit.Dropped)
)

// placeholders are the names of a handler kind's placeholders, joined
// once (joining per request would allocate).
type placeholders struct{ verdict, profile, messageType, limit string }

func newPlaceholders(prefix string) *placeholders {
	return &placeholders{prefix + "verdict", prefix + "profile", prefix + "message_type", prefix + "limit"}
}

var (
	httpPlaceholders   = newPlaceholders("http.peer_rate_limit.")
	egressPlaceholders = newPlaceholders("http.peer_rate_limit.egress.")
	l4Placeholders     = newPlaceholders("l4.peer_rate_limit.")
)

var (
	verdictVals      = [3]any{"admitted", "rejected", "dropped"}
	overallVal   any = "overall"
	peerLimitVal any = peerLimit
	emptyVal     any = ""
)

// buildProfiles builds the engines of cfgs and returns the
// rules marked dynamic.
func buildProfiles(ctx caddy.Context, cfgs []ProfileConfig) ([]*profile, []*ratelimit.Profile, []*ratelimit.Rule, error) {
	if err := registerMetrics(ctx); err != nil {
		return nil, nil, nil, err
	}
	if len(cfgs) == 0 {
		return nil, nil, nil, fmt.Errorf("peer_rate_limit: no profile configured")
	}
	var profiles []*profile
	var engines []*ratelimit.Profile
	var dynamicRules []*ratelimit.Rule
	for i := range cfgs {
		pc := &cfgs[i]
		engine, err := pc.build()
		if err != nil {
			return nil, nil, nil, err
		}
		p := &profile{cfg: pc, engine: engine, nameVal: pc.Name, typeVals: []any{emptyVal}}
		for _, m := range pc.Messages {
			p.typeVals = append(p.typeVals, m.Type)
		}
		if pc.Dynamic {
			if engine.Overall == nil {
				return nil, nil, nil, fmt.Errorf("peer_rate_limit: profile %s: dynamic needs an overall rate", pc.Name)
			}
			dynamicRules = append(dynamicRules, engine.Overall)
		}
		for _, m := range pc.Messages {
			if m.Dynamic {
				dynamicRules = append(dynamicRules, engine.Message(m.Type))
			}
		}
		profiles = append(profiles, p)
		engines = append(engines, engine)
	}
	return profiles, engines, dynamicRules, nil
}

// provisionHTTPProfiles is buildProfiles plus each message type's
// matchers. Its second argument, the handler's name, is unused (the
// engines count the decisions, see ratelimit.Store.Tallies).
func provisionHTTPProfiles(ctx caddy.Context, cfgs []ProfileConfig) ([]*httpProfile, []*ratelimit.Profile, []*ratelimit.Rule, error) {
	base, engines, dynamicRules, err := buildProfiles(ctx, cfgs)
	if err != nil {
		return nil, nil, nil, err
	}
	out := make([]*httpProfile, len(base))
	for i, p := range base {
		hp := &httpProfile{profile: p}
		for j := range p.cfg.Messages {
			m := &p.cfg.Messages[j]
			if m.MatchRaw == nil {
				return nil, nil, nil, fmt.Errorf("peer_rate_limit: profile %s: message %s has no match", p.cfg.Name, m.Type)
			}
			mod, err := ctx.LoadModule(m, "MatchRaw")
			if err != nil {
				return nil, nil, nil, fmt.Errorf("peer_rate_limit: profile %s: message %s: loading matchers: %v", p.cfg.Name, m.Type, err)
			}
			var set caddyhttp.MatcherSet
			for _, mm := range mod.(map[string]any) {
				set = append(set, mm)
			}
			hp.matchers = append(hp.matchers, set)
		}
		out[i] = hp
	}
	return out, engines, dynamicRules, nil
}

// decide classifies r, then decides for key (see profile.decide).
func (p *httpProfile) decide(r *http.Request, key string, repl *caddy.Replacer, ph *placeholders) (int, string, error) {
	msg, msgType := 0, ""
	for i, set := range p.matchers {
		ok, err := set.MatchWithError(r)
		if err != nil {
			return 0, "", caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if ok {
			msg, msgType = i+1, p.cfg.Messages[i].Type
			break
		}
	}
	verdict, limit := p.profile.decide(key, msg, msgType, repl, ph)
	return verdict, limit, nil
}

// decide asks the engine about one message of type msgType (index msg,
// 0 for other) from key, counts the verdict and sets the placeholders.
// It returns the verdict and the limit that refused.
func (p *profile) decide(key string, msg int, msgType string, repl *caddy.Replacer, ph *placeholders) (int, string) {
	ok, limit := p.engine.Decide(key, msgType, monoclock.Now().UnixNano())
	verdict := admitted
	if !ok {
		verdict = rejected
		if p.cfg.Action == "drop" {
			verdict = dropped
		}
	}
	p.engine.Count(msg, ratelimit.Verdict(verdict))
	limitVal := emptyVal
	switch limit {
	case "":
	case "overall":
		limitVal = overallVal
	default:
		limitVal = p.typeVals[msg]
	}
	repl.Set(ph.verdict, verdictVals[verdict])
	repl.Set(ph.profile, p.nameVal)
	repl.Set(ph.messageType, p.typeVals[msg])
	repl.Set(ph.limit, limitVal)
	return verdict, limit
}

// missingKeyPrefix sets the keys of requests whose peer placeholder was
// empty apart from the keys the placeholder names: a client that names
// itself "10.0.0.5" by a header does not share the bucket of the client at
// 10.0.0.5 that sent none. (Header values cannot hold a NUL.)
const missingKeyPrefix = "\x00"

// peerKey returns the key a request of this profile is limited under: the
// value of the profile's peer placeholder, or fallback (the key without
// one: the client IP, the remote IP, the CER's Origin-Host) when it has
// none. When a placeholder in peer is empty or unknown (a header the
// request lacks), every such request would share one key, so that one
// client could use up the limit of all the others: the request falls back
// to its own fallback key instead, or, with missing_peer refuse, ok is
// false and the request is to be refused.
func (p *profile) peerKey(repl *caddy.Replacer, fallback string) (key string, ok bool) {
	if p.cfg.Peer == "" {
		return fallback, true
	}
	key, err := repl.ReplaceOrErr(p.cfg.Peer, true, true)
	if err == nil && key != "" {
		return key, true
	}
	if p.cfg.MissingPeer == missingRefuse {
		return "", false
	}
	return missingKeyPrefix + fallback, true
}

// refuseUnnamed refuses a message whose peer placeholder was empty under
// missing_peer refuse, as the profile's action says: it counts the verdict
// and sets the placeholders ({…limit} is "peer") like decide.
func (p *profile) refuseUnnamed(msg int, repl *caddy.Replacer, ph *placeholders) int {
	verdict := rejected
	if p.cfg.Action == "drop" {
		verdict = dropped
	}
	p.engine.Count(msg, ratelimit.Verdict(verdict))
	repl.Set(ph.verdict, verdictVals[verdict])
	repl.Set(ph.profile, p.nameVal)
	repl.Set(ph.messageType, p.typeVals[msg])
	repl.Set(ph.limit, peerLimitVal)
	return verdict
}

// peerLimit names the "limit" that refuses a request without a peer.
const peerLimit = "peer"

// rejection is the status, body and Retry-After seconds (0: none) of a
// rejection by the named limit.
func (p *profile) rejection(limit string) (int, string, int) {
	if limit == peerLimit {
		// Not a limit: waiting will not help, the request lacks its peer.
		return http.StatusBadRequest, "peer identity missing\n", 0
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
	return status, body + "\n", retryAfter(rule)
}

// isGRPC reports whether a request is a gRPC call (Content-Type
// application/grpc, application/grpc+proto, application/grpc-web, …).
func isGRPC(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "application/grpc")
}

// grpcRefusal is a gRPC client's form of a rejection: HTTP 200 whose
// headers carry the call's status (a trailers-only response: headers, no
// body, end of stream), so that the client sees RESOURCE_EXHAUSTED — a
// status clients do not retry by default — instead of the UNAVAILABLE
// they make of an HTTP 429, which many retry at once. A request refused
// for lacking its peer gets INVALID_ARGUMENT. The Content-Type is the
// request's.
func grpcRefusal(h http.Header, contentType, limit, body string) {
	code := "8" // RESOURCE_EXHAUSTED
	if limit == peerLimit {
		code = "3" // INVALID_ARGUMENT
	}
	h.Set("Content-Type", contentType)
	h.Set("Grpc-Status", code)
	h.Set("Grpc-Message", grpcPercentEncode(strings.TrimSuffix(body, "\n")))
}

// grpcPercentEncode encodes a grpc-message value: bytes outside printable
// ASCII, and '%', as %XX (the gRPC over HTTP/2 spec).
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// retryAfter is the whole seconds until the rule admits again: at least 1.
func retryAfter(r *ratelimit.Rule) int {
	if r == nil {
		return 1
	}
	eff := r.Effective()
	if eff <= 0 {
		return 60
	}
	return max(1, int(math.Ceil(1/eff)))
}
