package ntier

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/edgesteer/edgesteer/internal/portrange"
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
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"upper":{"tier_map_file":"/etc/edgesteer/tiers.json","ports":["80","8000-8099"],"interfaces":["eth0"],` +
		`"health_port":3129,"health_interval":1000000000,"fall":2,"buckets":512,"table_base":300},` +
		`"lower":{"ports":["80"],"listen_port":3129,"mark":400}}`
	if got != want {
		t.Errorf("adapted\n%s\nwant\n%s", got, want)
	}
	for _, tc := range []struct{ src, want string }{
		{"ntier {\n\tupper {\n\t\tfall 0\n\t}\n}", "fall"},
		{"ntier {\n\tupper {\n\t\thealth_port 80\n\t\thealth_port 81\n\t}\n}", "health_port"},
		{"ntier {\n\tlower {\n\t\tlisten 3129\n\t}\n}", "listen"},
		{"ntier {\n\tupper\n\tupper\n}", "upper"},
		{"ntier {\n\tlower {\n\t\tlisten_port 70000\n\t}\n}", "70000"},
	} {
		if _, err := adapt("{\n" + tc.src + "\n}"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.src, err, tc.want)
		}
	}
}

// Bad configuration fails at Provision (so `caddy validate` reports it),
// naming the option and value, before anything touches the kernel.
func TestProvisionErrors(t *testing.T) {
	tiers := func(hops ...string) *portrange.Map {
		m := &portrange.Map{}
		for i, h := range hops {
			m.Nodes = append(m.Nodes, portrange.Node{Name: []string{"l2a", "l2b"}[i], NextHop: h})
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
}
