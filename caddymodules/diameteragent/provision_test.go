package diameteragent

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

// TestOneAgentPerName: a second config's handler of the same name updates
// the agent the first made; two handlers of one name in one config fail.
func TestOneAgentPerName(t *testing.T) {
	mk := func() *Handler {
		return &Handler{Name: "t-one-agent", OriginHost: "dra", OriginRealm: "r", HostIPAddresses: []string{"127.0.0.1"},
			Applications: []diameteragent.Application{{ID: 4}}}
	}
	ctx1, cancel1 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel1()
	first := mk()
	if err := first.Provision(ctx1); err != nil {
		t.Fatal(err)
	}
	twin := mk()
	if err := twin.Provision(ctx1); err == nil || !strings.Contains(err.Error(), `name "t-one-agent": given to two handlers of one config`) {
		t.Fatalf("same name twice in one config: %v", err)
	}
	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel2()
	next := mk()
	next.DefaultGroup = "nosuch"
	if err := next.Provision(ctx2); err == nil || !strings.Contains(err.Error(), `default_group "nosuch"`) {
		t.Fatalf("bad update: %v", err)
	}
	next.DefaultGroup = ""
	if err := next.Provision(ctx2); err != nil {
		t.Fatal(err)
	}
	if next.entry != first.entry {
		t.Fatal("the second config made a new agent")
	}
	first.Cleanup()
	next.Cleanup()
	if len(liveAgents()) != 0 {
		t.Fatalf("agents left: %d", len(liveAgents()))
	}
}
