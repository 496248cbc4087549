package peerratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// newGeneration stands for one config load: its own caddy.Context.
func newGeneration(t *testing.T) caddy.Context {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

func httpHandler(name string, rate float64, burst int) *HTTPHandler {
	return &HTTPHandler{leasedConfig: leasedConfig{Name: name, Profiles: []ProfileConfig{{Name: "all", Rate: rate, Burst: burst}}}}
}

// status sends one request from peer through h.
func status(t *testing.T, h *HTTPHandler, peer string) int {
	t.Helper()
	r := httptest.NewRequest("GET", "/", nil)
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
	c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: peer})
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(200); return nil })
	if err := h.ServeHTTP(w, r.WithContext(c), next); err != nil {
		t.Fatal(err)
	}
	return w.Code
}

func provision(t *testing.T, ctx caddy.Context, h *HTTPHandler) {
	t.Helper()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
}

// A reload the way Caddy runs it: the new generation provisions, then the
// old one cleans up. The peer that used its burst gets none from the new
// generation; the last cleanup destroys the state and stops its goroutines.
func TestReloadAdoptsBucketsAndReleasesLast(t *testing.T) {
	old := httpHandler("reload-test", 0.001, 1)
	provision(t, newGeneration(t), old)
	if status(t, old, "192.0.2.1") != 200 || status(t, old, "192.0.2.1") != 429 {
		t.Fatal("burst of 1 not enforced")
	}
	cur := httpHandler("reload-test", 0.001, 1)
	provision(t, newGeneration(t), cur)
	if old.lease.hs != cur.lease.hs {
		t.Fatal("the new generation did not adopt the state")
	}
	hs := cur.lease.hs
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := status(t, cur, "192.0.2.1"); got != 429 {
		t.Fatalf("after the reload the exhausted peer got %d", got)
	}
	if got := status(t, cur, "192.0.2.2"); got != 200 {
		t.Fatalf("another peer got %d", got)
	}
	if hs.ctx.Err() != nil {
		t.Fatal("the state's goroutines stopped while a generation holds it")
	}
	if err := cur.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if hs.ctx.Err() == nil {
		t.Fatal("the last cleanup left the state's goroutines running")
	}
	if _, ok := states.References(stateKey("http", "reload-test")); ok {
		t.Fatal("the state is still pooled")
	}
	if err := cur.Cleanup(); err != nil { // idempotent
		t.Fatal(err)
	}
	// A later generation starts afresh.
	next := httpHandler("reload-test", 0.001, 1)
	provision(t, newGeneration(t), next)
	defer next.Cleanup()
	if got := status(t, next, "192.0.2.1"); got != 200 {
		t.Fatalf("a new state refused the first request: %d", got)
	}
}

// A load that fails after this handler provisioned (Caddy then cleans up
// the new generation) leaves the running one's state and rules alone.
func TestFailedLoadKeepsState(t *testing.T) {
	old := httpHandler("failed-load-test", 0.001, 2)
	provision(t, newGeneration(t), old)
	defer old.Cleanup()
	status(t, old, "192.0.2.1")
	failed := httpHandler("failed-load-test", 1000, 1000)
	provision(t, newGeneration(t), failed)
	failed.Cleanup()
	if status(t, old, "192.0.2.1") != 200 || status(t, old, "192.0.2.1") != 429 {
		t.Fatal("the running generation's burst of 2 changed")
	}
}

// Two handlers in one config: the same name with different configs is an
// error naming it; the same config (a site served on several ports)
// shares the state; unnamed handlers get names from their configs.
func TestNamesInOneGeneration(t *testing.T) {
	ctx := newGeneration(t)
	a := httpHandler("dup-test", 10, 0)
	provision(t, ctx, a)
	defer a.Cleanup()
	b := httpHandler("dup-test", 20, 0)
	err := b.Provision(ctx)
	b.Cleanup()
	if err == nil || !strings.Contains(err.Error(), `name "dup-test"`) {
		t.Fatalf("duplicate name: %v", err)
	}
	same := httpHandler("dup-test", 10, 0)
	provision(t, ctx, same)
	defer same.Cleanup()
	if same.lease.hs != a.lease.hs {
		t.Fatal("a repeated handler does not share its state")
	}

	u1, u2, u3 := httpHandler("", 10, 0), httpHandler("", 20, 0), httpHandler("", 10, 0)
	for _, h := range []*HTTPHandler{u1, u2, u3} {
		provision(t, ctx, h)
		defer h.Cleanup()
	}
	if !strings.HasPrefix(u1.Name, "http-") || u1.Name == u2.Name || u1.Name != u3.Name {
		t.Fatalf("default names %q %q %q", u1.Name, u2.Name, u3.Name)
	}
}
