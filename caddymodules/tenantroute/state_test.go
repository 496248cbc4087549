package tenantroute

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// generation returns a context like the one Caddy makes for each config
// load (its own metrics registry marks the generation).
func generation(t *testing.T) caddy.Context {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

func provision(t *testing.T, ctx caddy.Context, h *TenantRoute) *TenantRoute {
	t.Helper()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// Caddy's order on a reload: the new generation provisions, then the old
// one cleans up. The state (live counts, run-time overrides) is adopted and
// the new settings applied; a generation that fails to load (provisioned,
// then cleaned up while the old one runs on) gives the old settings back.
func TestReloadAdoptsState(t *testing.T) {
	a, b, c, d := "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"
	g1 := provision(t, generation(t), &TenantRoute{Name: "reload", Nodes: []string{a, b, c}, Partitions: 1})
	node, _ := g1.placer.Reserve("acme", time.Now())
	g1.placer.SetPartitions("globex", 3)

	g2 := provision(t, generation(t), &TenantRoute{Name: "reload", Nodes: []string{a, b, c}, Partitions: 2})
	if g2.state != g1.state {
		t.Fatal("the new generation did not adopt the state")
	}
	g1.Cleanup()
	if n, ok := states.References("reload"); !ok || n != 1 {
		t.Fatalf("references after the old cleanup: %d %v", n, ok)
	}
	p := g2.placer
	if p.Conns()[node] != 1 || p.Partitions("globex") != 3 || p.DefaultPartitions() != 2 {
		t.Fatalf("adopted state: conns %v globex %d k %d", p.Conns(), p.Partitions("globex"), p.DefaultPartitions())
	}
	// The old generation's connection closes: it is uncounted in the state.
	g1.placer.Release(node)
	if p.Conns()[node] != 0 {
		t.Fatalf("release by the old generation not seen: %v", p.Conns())
	}

	// A config that fails to load after this handler provisioned.
	g3 := provision(t, generation(t), &TenantRoute{Name: "reload", Nodes: []string{a, b, c, d}, Partitions: 3})
	if len(p.Nodes()) != 4 || p.DefaultPartitions() != 3 {
		t.Fatal("new settings not applied")
	}
	g3.Cleanup()
	if !slices.Equal(p.Nodes(), []string{a, b, c}) || p.DefaultPartitions() != 2 {
		t.Fatalf("after the failed load: nodes %v k %d, want the running config's", p.Nodes(), p.DefaultPartitions())
	}
	g2.Cleanup()
	g2.Cleanup() // twice is harmless
	if _, ok := states.References("reload"); ok {
		t.Fatal("state kept with no config using it")
	}
}

// Without a name, handlers with different members get different state;
// two handlers of one config that share a name must share its settings.
func TestNamesKeepHandlersApart(t *testing.T) {
	ctx := generation(t)
	x := provision(t, ctx, &TenantRoute{Nodes: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	y := provision(t, ctx, &TenantRoute{Nodes: []string{"127.0.0.1:3", "127.0.0.1:4"}})
	z := provision(t, ctx, &TenantRoute{Nodes: []string{"127.0.0.1:2", "127.0.0.1:1"}})
	defer x.Cleanup()
	defer y.Cleanup()
	defer z.Cleanup()
	if x.Name == y.Name || x.state == y.state || !strings.HasPrefix(x.Name, "tenant_route-") {
		t.Fatalf("unnamed handlers with different nodes share %q / %q", x.Name, y.Name)
	}
	if x.state != z.state {
		t.Fatal("the same node set in another order got other state")
	}
	err := (&TenantRoute{Name: x.Name, Nodes: x.Nodes, Partitions: 3}).Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "give each its own name") {
		t.Fatalf("conflicting settings under one name: %v", err)
	}
	if n, _ := states.References(x.Name); n != 2 {
		t.Fatalf("a refused handler kept a reference: %d", n)
	}
}
