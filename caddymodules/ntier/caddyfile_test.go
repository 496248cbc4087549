package ntier

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

func adapt(src string) (string, error) {
	out, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(src), nil)
	if err != nil {
		return "", err
	}
	var cfg struct {
		Apps map[string]json.RawMessage `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		return "", err
	}
	return string(cfg.Apps[AppName]), nil
}

func TestGlobalOption(t *testing.T) {
	got, err := adapt(`{
	ntier {
		upper {
			tier_map /etc/edgesteer/tiers.json
			ports 80
			ports 8000-8099
			interfaces eth0
			health_port 3129
			health_interval 1s
			fall 2
			buckets 512
			table_base 300
		}
		lower {
			ports 80
			listen_port 3129
			mark 400
			ip_versions 6
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"upper":{"tier_map_file":"/etc/edgesteer/tiers.json","ports":["80","8000-8099"],"interfaces":["eth0"],` +
		`"health_port":3129,"health_interval":1000000000,"fall":2,"buckets":512,"table_base":300},` +
		`"lower":{"ports":["80"],"listen_port":3129,"mark":400,"ip_versions":[6]}}`
	if got != want {
		t.Errorf("adapted\n%s\nwant\n%s", got, want)
	}
	for _, tc := range []struct{ src, want string }{
		{"ntier {\n\tupper {\n\t\tfall 0\n\t}\n}", "fall"},
		{"ntier {\n\tupper {\n\t\thealth_port 80\n\t\thealth_port 81\n\t}\n}", "health_port"},
		{"ntier {\n\tlower {\n\t\tlisten 3129\n\t}\n}", "listen"},
		{"ntier {\n\tupper\n\tupper\n}", "upper"},
		{"ntier {\n\tlower {\n\t\tlisten_port 70000\n\t}\n}", "70000"},
		{"ntier {\n\tlower {\n\t\tip_versions 4 5\n\t}\n}", `ip_versions "5"`},
	} {
		if _, err := adapt("{\n" + tc.src + "\n}"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.src, err, tc.want)
		}
	}
}

// Bad configuration fails at Provision (so `caddy validate` reports it),
// naming the option and value, before anything touches the kernel.
func TestProvisionErrors(t *testing.T) {
	tiers := func(hops ...string) *srcports.Map {
		m := &srcports.Map{}
		for i, h := range hops {
			v4, v6, _ := strings.Cut(h, ",")
			m.Nodes = append(m.Nodes, srcports.Node{Name: []string{"l2a", "l2b"}[i], NextHop: v4, NextHop6: v6})
		}
		return m
	}
	for _, tc := range []struct {
		name string
		app  App
		want string
	}{
		{"nothing", App{}, "give upper or lower"},
		{"overlapping ports", App{Upper: &Upper{TierMap: tiers("10.0.0.2", "10.0.0.3"), Ports: []string{"80-90", "85"}}}, "ports: 80-90 and 85-85 overlap"},
		{"node without next hop", App{Upper: &Upper{TierMap: tiers("10.0.0.2", ""), Ports: []string{"80"}}}, `node "l2b": no next_hop`},
		{"bad next hop", App{Upper: &Upper{TierMap: tiers("10.0.0.2", "ten"), Ports: []string{"80"}}}, `next_hop "ten"`},
		{"IPv4 next_hop6", App{Upper: &Upper{TierMap: tiers("10.0.0.2,10.0.0.9", "10.0.0.3"), Ports: []string{"80"}}}, `node "l2a": next_hop6 10.0.0.9: not an IPv6 address`},
		{"two IPv6 next hops", App{Upper: &Upper{TierMap: tiers("fd00::2,fd00::9", "fd00::3"), Ports: []string{"80"}}}, "two IPv6 next hops"},
		{"one node without IPv6", App{Upper: &Upper{TierMap: tiers("10.0.0.2,fd00::2", "10.0.0.3"), Ports: []string{"80"}}}, `node "l2b": no IPv6 next_hop6, while other nodes have one`},
		{"one node IPv6 only", App{Upper: &Upper{TierMap: tiers("fd00::2", "10.0.0.3"), Ports: []string{"80"}}}, `node "l2a": no IPv4 next_hop, while other nodes have one`},
		{"lower ip_versions", App{Lower: &Lower{Ports: []string{"80"}, ListenPort: 3129, IPVersions: []int{4, 4}}}, "ip_versions [4 4]"},
		{"no tier map", App{Upper: &Upper{Ports: []string{"80"}}}, "tier_map_file (or tier_map) is required"},
		{"bad port", App{Upper: &Upper{TierMap: tiers("10.0.0.2"), Ports: []string{"http"}}}, `"http"`},
		{"lower overlap", App{Lower: &Lower{Ports: []string{"80", "79-81"}, ListenPort: 3129}}, "overlap"},
		{"lower without listen port", App{Lower: &Lower{Ports: []string{"80"}}}, "listen_port 0"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := tc.app.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// Both families on every node, or IPv6 only, provision; the health
	// check goes to the first next hop.
	for hops, health := range map[[2]string]string{{"10.0.0.2,fd00::2", "10.0.0.3,fd00::3"}: "10.0.0.2:80", {"fd00::2", "fd00::3"}: "[fd00::2]:80"} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		app := App{Upper: &Upper{TierMap: tiers(hops[0], hops[1]), Ports: []string{"80"}}}
		err := app.Provision(ctx)
		cancel()
		if err != nil || app.upper.Nodes[0].Health != health || !app.upper.Nodes[1].NextHop6.IsValid() {
			t.Errorf("%v: %v, nodes %+v", hops, err, app.upper.Nodes)
		}
	}
}
