package latencybucket

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// Placeholder values are Stringers over the status, so setting them costs
// no allocation; they are rendered only if something uses them (the access
// log's log_append fields render them when the request is logged).
type (
	publisherText pubsel.Status
	latencyText   pubsel.Status
	bucketText    pubsel.Status
	decidedText   pubsel.Status
)

func (s *publisherText) String() string { return s.Addr }
func (s *bucketText) String() string    { return s.Label }
func (s *decidedText) String() string   { return s.DecidedBy }
func (s *latencyText) String() string {
	if !s.Measured {
		return ""
	}
	return strconv.FormatFloat(ms(s.Latency), 'f', 3, 64)
}

// pairText holds the pair of one decision: one allocation for both
// placeholders (a string boxed into the replacer would cost one each).
type pairText struct{ user, app string }
type (
	userText pairText
	appText  pairText
)

func (p *userText) String() string { return p.user }
func (p *appText) String() string  { return p.app }

// placeholderKeys are the placeholder names under one prefix, joined once:
// a name joined per request would cost an allocation each.
type placeholderKeys struct{ publisher, latency, bucket, decidedBy, decision, user, app string }

func keysFor(prefix string) *placeholderKeys {
	return &placeholderKeys{prefix + "publisher", prefix + "latency_ms", prefix + "bucket",
		prefix + "decided_by", prefix + "decision", prefix + "user", prefix + "app"}
}

var (
	httpKeys = keysFor("http.reverse_proxy.latency_bucket.")
	l4Keys   = keysFor("l4.proxy.latency_bucket.")
)

// setPlaceholders publishes decision d for (user, app); user and app are
// empty for a request or connection that has no pair (sticky off, an
// empty sticky_user with sticky_user_fallback none).
func setPlaceholders(repl *caddy.Replacer, k *placeholderKeys, d pubsel.Decision, user, app string) {
	repl.Set(k.publisher, (*publisherText)(d.Status))
	repl.Set(k.latency, (*latencyText)(d.Status))
	repl.Set(k.bucket, (*bucketText)(d.Status))
	repl.Set(k.decidedBy, (*decidedText)(d.Status))
	repl.Set(k.decision, decisionWord(d))
	pair := &pairText{user, app}
	repl.Set(k.user, (*userText)(pair))
	repl.Set(k.app, (*appText)(pair))
}

func decisionWord(d pubsel.Decision) string {
	if d.Sticky {
		return "sticky"
	}
	return "new"
}

// logDecision writes one layer4 pick as a structured line (log_decisions).
func (p *policy) logDecision(conn *layer4.Connection, d pubsel.Decision, user, app string) {
	st := d.Status
	fields := []zap.Field{
		zap.String("policy", p.name),
		zap.String("user", user), zap.String("app", app),
		zap.String("publisher", st.Addr), zap.String("bucket", st.Label),
		zap.String("decision", decisionWord(d)), zap.String("decided_by", st.DecidedBy),
		zap.Bool("from_store", d.FromStore),
	}
	if st.Measured {
		fields = append(fields, zap.Float64("latency_ms", ms(st.Latency)))
	}
	if conn != nil {
		if ra := conn.RemoteAddr(); ra != nil {
			fields = append(fields, zap.String("remote", ra.String()))
		}
		if la := conn.LocalAddr(); la != nil {
			fields = append(fields, zap.String("network", la.Network()), zap.String("local", la.String()))
		}
	}
	p.logger.Info("publisher decision", fields...)
}
