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
// message matching (method and path matchers), two buckets, counters and
// placeholders. bench/peer_rate_limit.sh measures it against the same
// proxy without the handler.
func BenchmarkServeHTTP(b *testing.B) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &HTTPHandler{limiter: limiter{Profiles: []ProfileConfig{{
		Name: "all", Rate: 1e9,
		Messages: []MessageConfig{{Type: "ccr-i", Rate: 1e9,
			MatchRaw: caddy.ModuleMap{"method": []byte(`["POST"]`), "path": []byte(`["/gx/ccr-i"]`)}}},
	}}}}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Cleanup()
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	newReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/gx/ccr-u", nil)
		repl := caddy.NewReplacer()
		c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
		c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.7"})
		return r.WithContext(c)
	}
	w := httptest.NewRecorder()
	r := newReq()
	for b.Loop() {
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
}
