package latencybucket

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// generation provisions an HTTPPolicy in a context of its own, as a config
// load does.
func generation(t *testing.T, c Config) (*HTTPPolicy, error) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	h := &HTTPPolicy{Config: c}
	return h, h.Provision(ctx)
}

// Through the adapter: a second generation with the same name adopts the
// pooled state (same table, pins and measurements) with its new bucket
// width, the first one's Cleanup only drops a reference, and the last
// Cleanup destroys the state.
func TestGenerationsShareThePooledState(t *testing.T) {
	pool := make(reverseproxy.UpstreamPool, 4)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: e2e.ClosingListener(t)}
	}
	cfg := Config{Name: "pool-test", ProbeInterval: caddy.Duration(50 * time.Millisecond)}
	gen1, err := generation(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := func(user string) *http.Request {
		r, _ := http.NewRequest("GET", "http://app/", nil)
		r.RemoteAddr = user + ":1"
		return r
	}
	gen1.Select(pool, req("192.0.2.1"), nil)
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; n < 4; {
		n = 0
		for _, st := range gen1.policy.state.Tracker().Statuses() {
			if st.Measured {
				n++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 measured", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	pins := map[string]*reverseproxy.Upstream{}
	for i := range 40 {
		user := fmt.Sprintf("192.0.2.%d", i+10)
		pins[user] = gen1.Select(pool, req(user), nil)
	}

	cfg.BucketWidth = caddy.Duration(16 * time.Millisecond)
	gen2, err := generation(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The upstreams here come from the pool (no reverse_proxy handler in
	// the context): the first pick holds them, as Provision holds static
	// upstreams, before the old generation's Cleanup.
	gen2.Select(pool, req("192.0.2.1"), nil)
	gen1.Cleanup()
	if gen2.policy.table != gen1.policy.table || gen2.policy.state.Tracker().Config().BucketWidth != 16*time.Millisecond {
		t.Fatal("the second generation did not adopt the state with its settings")
	}
	if refs, ok := states.References(stateKey{"http", "pool-test"}); !ok || refs != 1 {
		t.Fatalf("pool references %d, %v", refs, ok)
	}
	for user, u := range pins {
		if got := gen2.Select(pool, req(user), nil); got != u {
			t.Fatalf("%s moved across the reload", user)
		}
		// Caddy cleans up the old config without waiting for its last
		// requests: they keep their pins too.
		if got := gen1.Select(pool, req(user), nil); got != u {
			t.Fatalf("%s moved in the old config's last requests", user)
		}
	}

	// Two policies of one generation under one name must agree.
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &HTTPPolicy{Config: Config{Name: "twice"}}
	b := &HTTPPolicy{Config: Config{Name: "twice", BucketWidth: caddy.Duration(time.Millisecond)}}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(ctx); err == nil || !strings.Contains(err.Error(), `name "twice"`) {
		t.Fatalf("conflicting settings under one name: %v", err)
	}
	b.Cleanup()
	a.Cleanup()

	tracker := gen2.policy.state.Tracker()
	gen2.Cleanup()
	if _, ok := states.References(stateKey{"http", "pool-test"}); ok || len(pooledStates()) != 0 {
		t.Fatal("the state outlived its last generation")
	}
	tracker.Stop() // returns at once: the probers are gone
}

// A name belongs to one kind: metrics and the admin view label states by
// name alone.
func TestNameUsedByBothKindsFails(t *testing.T) {
	h, err := generation(t, Config{Name: "both-kinds"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	l4 := &L4Policy{Config: Config{Name: "both-kinds"}}
	err = l4.Provision(ctx)
	l4.Cleanup()
	if err == nil || !strings.Contains(err.Error(), `name "both-kinds" is already used by an HTTP policy`) {
		t.Fatalf("layer4 policy named like an HTTP one: %v", err)
	}
	if _, ok := states.References(stateKey{"layer4", "both-kinds"}); ok {
		t.Fatal("the refused policy left a state behind")
	}
}

// latency traffic or both without the latency_bucket transport in the same
// reverse_proxy fails at load, naming the option and value.
func TestTrafficNeedsTheTransport(t *testing.T) {
	for _, l := range []string{"traffic", "both"} {
		_, err := generation(t, Config{Name: "no-transport-" + l, Latency: l})
		want := "latency_bucket: latency " + l + ": this reverse_proxy's requests are not observed"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q", err, want)
		}
	}
	h, err := generation(t, Config{Name: "no-transport-probe", Latency: "probe"})
	if err != nil {
		t.Fatalf("latency probe needs no transport: %v", err)
	}
	h.Cleanup()
}

// within p2c needs the latency_bucket transport (it counts the requests in
// flight) in the same reverse_proxy: without it the config fails at load.
func TestP2CNeedsTheTransport(t *testing.T) {
	_, err := generation(t, Config{Name: "no-transport-p2c", Within: "p2c"})
	want := "latency_bucket: within p2c: this reverse_proxy's requests in flight are not counted"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}
