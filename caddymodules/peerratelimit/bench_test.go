package peerratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkServeHTTP is the handler's whole per-request cost on a request
// it admits (a profile whose limits are never reached): client IP, profile,
// message matching (method and path matchers; the request matches its
// message rule), two buckets, counters and placeholders. bench/peer_rate_limit.sh measures it against the same
// proxy without the handler.
func BenchmarkServeHTTP(b *testing.B) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &HTTPHandler{leasedConfig: leasedConfig{Profiles: []ProfileConfig{{
		Name: "all", Rate: 1e9,
		Messages: []MessageConfig{{Type: "ccr-i", Rate: 1e9,
			MatchRaw: caddy.ModuleMap{"method": []byte(`["POST"]`), "path": []byte(`["/gx/ccr-i"]`)}}},
	}}}}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Cleanup()
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	// The request matches the message rule, so both buckets (the type's
	// and the overall) are checked: the whole decision.
	r := httptest.NewRequest("POST", "/gx/ccr-i", nil)
	repl := caddy.NewReplacer()
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.7"})
	r = r.WithContext(c)
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, next); err != nil {
		b.Fatal(err)
	}
	if mt, _ := repl.Get("http.peer_rate_limit.message_type"); mt != "ccr-i" {
		b.Fatalf("the benchmark request matched message type %q, want ccr-i", mt)
	}
	if v, _ := repl.Get("http.peer_rate_limit.verdict"); v != "admitted" {
		b.Fatalf("verdict %v, want admitted", v)
	}
	for b.Loop() {
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
}
