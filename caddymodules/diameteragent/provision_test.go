package diameteragent

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

// config is one Caddy config being loaded: its context and installer.
type config struct {
	ctx caddy.Context
}

func newConfig(t *testing.T) config {
	t.Helper()
	ctx, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return config{ctx: ctx}
}

// start does what Caddy does once every module of the config is
// provisioned: it starts the config's apps, the installer among them.
func (c config) start(t *testing.T) {
	t.Helper()
	app, err := c.ctx.App(installerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.(caddy.App).Start(); err != nil {
		t.Fatal(err)
	}
}

// TestInstallOnStart: a config's handler changes its agent only when the
// config starts, so a config failing before that (another module's error)
// leaves the agent as it was, and one failing after goes back to the
// config before. A second config's handler of the same name updates the
// agent the first made; two handlers of one name in one config fail.
func TestInstallOnStart(t *testing.T) {
	mk := func(realm string) *Handler {
		return &Handler{Name: "t-one-agent", OriginHost: "dra", OriginRealm: "r", HostIPAddresses: []string{"127.0.0.1"},
			Applications: []diameteragent.Application{{ID: 4}},
			Peers:        []PeerConfig{{Host: "p", Realm: "r", Address: "127.0.0.1:1"}},
			Groups:       []GroupConfig{{Name: "g", Peers: []string{"p"}}},
			Routes:       []RouteConfig{{Realm: realm, Group: "g"}}}
	}
	routed := func(h *Handler) string { return h.entry.agent.View().Routes[0].Realm }
	c1 := newConfig(t)
	first := mk("one")
	if err := first.Provision(c1.ctx); err != nil {
		t.Fatal(err)
	}
	twin := mk("one")
	if err := twin.Provision(c1.ctx); err == nil || !strings.Contains(err.Error(), `name "t-one-agent": given to two handlers of one config`) {
		t.Fatalf("same name twice in one config: %v", err)
	}
	c1.start(t)

	// Provisioned, then the config fails (it never starts).
	failed := mk("failed")
	if err := failed.Provision(newConfig(t).ctx); err != nil {
		t.Fatal(err)
	}
	if failed.entry != first.entry {
		t.Fatal("the second config made a new agent")
	}
	if got := routed(first); got != "one" {
		t.Fatalf("a config not started yet routes %q", got)
	}
	failed.Cleanup()
	if got := routed(first); got != "one" {
		t.Fatalf("after a failed load the agent routes %q", got)
	}
	bad := mk("one")
	bad.DefaultGroup = "nosuch"
	if err := bad.Provision(newConfig(t).ctx); err == nil || !strings.Contains(err.Error(), `default_group "nosuch"`) {
		t.Fatalf("bad update: %v", err)
	}
	bad.Cleanup()

	// A reload that starts installs its configuration; the old config's
	// cleanup then changes nothing.
	c3 := newConfig(t)
	third := mk("three")
	if err := third.Provision(c3.ctx); err != nil {
		t.Fatal(err)
	}
	c3.start(t)
	first.Cleanup()
	if got := routed(third); got != "three" {
		t.Fatalf("after a reload the agent routes %q, want three", got)
	}
	// One that fails after it started (another app's Start): back to three.
	c4 := newConfig(t)
	fourth := mk("four")
	if err := fourth.Provision(c4.ctx); err != nil {
		t.Fatal(err)
	}
	c4.start(t)
	if got := routed(third); got != "four" {
		t.Fatalf("started config: routes %q", got)
	}
	fourth.Cleanup()
	if got := routed(third); got != "three" {
		t.Fatalf("after a config failed at start the agent routes %q, want three", got)
	}
	third.Cleanup()
	if len(liveAgents()) != 0 {
		t.Fatalf("agents left: %d", len(liveAgents()))
	}
}
