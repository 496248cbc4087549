package cacheredirect_test

import (
	"os"
	"path/filepath"
	"testing"

	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	_ "github.com/edgesteer/edgesteer/caddymodules/cacheredirect"
	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	_ "github.com/edgesteer/edgesteer/caddymodules/portrange"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

func TestAdaptCaddyfile(t *testing.T) {
	cf := `http://:8080 {
	cache_redirect {
		node l2a
		tier_map tiers.json
		caches 10.0.2.5:6081 10.0.2.6:6081
		origin 10.0.3.9:80
		client_ip_header X-Client-IP
		trusted 10.0.1.0/24
		bypass_path /api/* *.php
		bypass_cookie session
		bypass_header Cache-Control *no-cache*
		bypass_header X-Debug
		cache_fail_duration 5s
		http {
			dial_timeout 2s
		}
	}
}`
	cfparsetest.Adapts(t, cf,
		`"bypass_headers":{"Cache-Control":"*no-cache*","X-Debug":""}`,
		`"bypass_paths":["/api/*","*.php"]`,
		`"caches":["10.0.2.5:6081","10.0.2.6:6081"]`,
		`"cache_fail_duration":5000000000`,
		`"client_ip_header":"X-Client-IP"`,
		`"handler":"cache_redirect","node":"l2a"`,
		`"origin_transport":{"http":{"dial_timeout":2000000000},"node":"l2a","tier_map_file":"tiers.json"}`)
}

// Bad config fails caddy validate, naming the option and value.
func TestBadConfigFailsValidate(t *testing.T) {
	dir := t.TempDir()
	tiers := filepath.Join(dir, "tiers.json")
	os.WriteFile(tiers, []byte(`{"nodes":[{"name":"a","ports":"2000-3000"},{"name":"b","ports":"2500-4000"}]}`), 0o644)
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"nodes":[{"name":"a"},{"name":"b"}]}`), 0o644)
	wrap := func(body string) string {
		return "http://127.0.0.1:1 {\n\tcache_redirect {\n\t\tcaches 127.0.0.5:6081\n\t\torigin 127.0.0.6:80\n" + body + "\n\t}\n}\n"
	}
	for name, tc := range map[string]struct{ cf, want string }{
		"no caches":      {"http://127.0.0.1:1 {\n\tcache_redirect {\n\t\torigin 127.0.0.6:80\n\t}\n}\n", "caches and origin are required"},
		"bad glob":       {wrap("bypass_path /a[b"), `bypass path "/a[b"`},
		"bad method":     {wrap("methods get"), `method "get"`},
		"bad trusted":    {wrap("trusted 10.0.0.0/40"), `"10.0.0.0/40"`},
		"overlap":        {wrap("tier_map " + tiers + "\nnode a"), `nodes "a" (2000-3000) and "b" (2500-4000) overlap`},
		"unknown node":   {wrap("tier_map " + good + "\nnode c"), `node "c" is not in the tier map`},
		"no node":        {wrap("tier_map " + good), "needs node"},
		"bad ports":      {wrap("ports 5000-4000"), `port range "5000-4000"`},
		"both":           {wrap("ports 5000-6000\ntier_map " + good + "\nnode a"), "not both"},
		"usip+local":     {wrap("ports 5000-6000\nusip\nlocal_ip 127.0.0.1"), "local_ip and usip"},
		"unknown option": {wrap("colour blue"), `unknown option "colour"`},
		"repeat":         {wrap("cache_timeout 1s\ncache_timeout 2s"), "cache_timeout given twice (first at "},
		"unitless":       {wrap("cache_fail_duration 10"), `cache_fail_duration "10": want a positive duration`},
		"cache host":     {"http://127.0.0.1:1 {\n\tcache_redirect {\n\t\tcaches cache.example:6081\n\t\torigin 127.0.0.6:80\n\t}\n}\n", `"cache.example"`},
	} {
		t.Run(name, func(t *testing.T) { e2e.ValidateFails(t, tc.cf, tc.want) })
	}
}
