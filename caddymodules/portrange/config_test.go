package portrange_test

import (
	"testing"

	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	_ "github.com/edgesteer/edgesteer/caddymodules/portrange"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

func TestAdaptCaddyfile(t *testing.T) {
	cf := `{
	layer4 {
		127.0.0.1:8700 {
			@a port_range remote 1024-2047 3000
			route @a {
				proxy 127.0.0.1:9001
			}
			@b port_range {
				side local
				tier_map tiers.json
				node l2b
			}
			route @b {
				proxy 127.0.0.1:9002
			}
		}
	}
}
http://127.0.0.1:8080 {
	reverse_proxy 127.0.0.1:9000 {
		transport port_range {
			ports 20000-29999
			local_ip 127.0.0.1
			http {
				keepalive 90s
			}
		}
	}
}`
	cfparsetest.Adapts(t, cf,
		`"port_range":{"side":"remote","ports":["1024-2047","3000"]}`,
		`"port_range":{"side":"local","tier_map_file":"tiers.json","node":"l2b"}`,
		`"transport":{"http":{"keep_alive":{"idle_timeout":90000000000}},"local_ip":"127.0.0.1","ports":"20000-29999","protocol":"port_range"}`)
}

func TestBadConfigFailsValidate(t *testing.T) {
	l4 := func(matcher string) string {
		return "{\n\tlayer4 {\n\t\t127.0.0.1:1 {\n\t\t\t@m " + matcher + "\n\t\t\troute @m {\n\t\t\t\tproxy 127.0.0.1:2\n\t\t\t}\n\t\t}\n\t}\n}\n"
	}
	rp := func(body string) string {
		return "http://127.0.0.1:1 {\n\treverse_proxy 127.0.0.1:2 {\n\t\ttransport port_range {\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	for name, tc := range map[string]struct{ cf, want string }{
		"matcher side":       {l4("port_range {\nside up\nports 1-2\n}"), `side "up"`},
		"matcher range":      {l4("port_range remote 9-3"), `port range "9-3"`},
		"matcher empty":      {l4("port_range"), "give ports or tier_map and node"},
		"matcher no map":     {l4("port_range {\nnode a\n}"), `node "a" needs tier_map`},
		"matcher no file":    {l4("port_range {\ntier_map /nonexistent/tiers.json\nnode a\n}"), "/nonexistent/tiers.json"},
		"transport empty":    {rp(""), "give ports or tier_map and node"},
		"transport local_ip": {rp("ports 2000-3000\nlocal_ip nowhere"), `local_ip "nowhere"`},
		"transport option":   {rp("ports 2000-3000\nspeed fast"), `unknown option "speed"`},
		"transport repeat":   {rp("ports 2000-3000\nports 4000-5000"), "port_range transport: ports given twice (first at "},
		"matcher extra arg":  {l4("port_range {\nnode a b\n}"), "port_range matcher: node: want 1 argument, got 2: a b"},
	} {
		t.Run(name, func(t *testing.T) { e2e.ValidateFails(t, tc.cf, tc.want) })
	}
}
