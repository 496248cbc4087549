package cacheredirect_test

import (
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/cacheredirect"
	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []cfparsetest.Case{
		{Input: "cache_redirect", Expected: `{"caches":null,"origin":null}`},
		{Input: `cache_redirect {
			node l2a
			tier_map tiers.json
			caches 10.0.2.5:6081 10.0.2.6:6081
			caches 10.0.2.7:6081
			origin 10.0.3.9:80
			client_ip_header Client-IP
			trusted 10.0.1.0/24
			cache_peers 10.0.2.0/24
			methods GET HEAD
			bypass_path /api/* *.php
			bypass_cookie session
			bypass_header Cache-Control *no-cache*
			bypass_header X-Debug
			cache_fail_duration 10s
			cache_timeout 30s
			usip
			http {
				dial_timeout 2s
			}
		}`, Expected: `{"node":"l2a","caches":["10.0.2.5:6081","10.0.2.6:6081","10.0.2.7:6081"],"origin":["10.0.3.9:80"],` +
			`"client_ip_header":"Client-IP","trusted":["10.0.1.0/24"],"cache_peers":["10.0.2.0/24"],"methods":["GET","HEAD"],` +
			`"bypass_paths":["/api/*","*.php"],"bypass_cookies":["session"],"bypass_headers":{"Cache-Control":"*no-cache*","X-Debug":""},` +
			`"cache_fail_duration":10000000000,"cache_timeout":30000000000,` +
			`"origin_transport":{"tier_map_file":"tiers.json","node":"l2a","usip":true,"http":{"dial_timeout":2000000000}}}`},
		{Input: "cache_redirect {\nports 20000-29999\n}", Expected: `{"caches":null,"origin":null,"origin_transport":{"ports":"20000-29999"}}`},

		// Repeats: single options (the transport's too) once, bypass_header once per name.
		{Input: "cache_redirect {\nnode a\nnode b\n}", ExpectedErr: "cache_redirect: node given twice (first at Testfile:2), at Testfile:3"},
		{Input: "cache_redirect {\nclient_ip_header A\nclient_ip_header B\n}", ExpectedErr: "cache_redirect: client_ip_header given twice"},
		{Input: "cache_redirect {\ncache_timeout 1s\ncaches a:1\ncache_timeout 2s\n}", ExpectedErr: "cache_redirect: cache_timeout given twice (first at Testfile:2), at Testfile:4"},
		{Input: "cache_redirect {\nports 1-2\nports 3-4\n}", ExpectedErr: "cache_redirect: ports given twice"},
		{Input: "cache_redirect {\ntier_map a\ntier_map b\n}", ExpectedErr: "cache_redirect: tier_map given twice"},
		{Input: "cache_redirect {\nhttp {\n}\nhttp {\n}\n}", ExpectedErr: "cache_redirect: http given twice"},
		{Input: "cache_redirect {\nbypass_header X-Debug\nbypass_header x-debug 1\n}", ExpectedErr: "cache_redirect: bypass_header X-Debug given twice (first at Testfile:2), at Testfile:3"},

		// Arguments.
		{Input: "cache_redirect 10.0.2.5:6081", ExpectedErr: "cache_redirect: want no arguments, got 1: 10.0.2.5:6081, at Testfile:1"},
		{Input: "cache_redirect {\nnode a b\n}", ExpectedErr: "cache_redirect: node: want 1 argument, got 2: a b, at Testfile:2"},
		{Input: "cache_redirect {\nclient_ip_header\n}", ExpectedErr: "cache_redirect: client_ip_header: want 1 argument, got none"},
		{Input: "cache_redirect {\ncache_timeout 1s 2s\n}", ExpectedErr: "cache_redirect: cache_timeout: want 1 argument, got 2: 1s 2s"},
		{Input: "cache_redirect {\nbypass_header\n}", ExpectedErr: "cache_redirect: bypass_header: want 1 to 2 arguments, got none, at Testfile:2"},
		{Input: "cache_redirect {\nbypass_header A b c\n}", ExpectedErr: "cache_redirect: bypass_header: want 1 to 2 arguments, got 3: A b c"},
		{Input: "cache_redirect {\ncaches\n}", ExpectedErr: "cache_redirect: caches: want at least 1 argument, got none, at Testfile:2"},
		{Input: "cache_redirect {\nusip yes\n}", ExpectedErr: "cache_redirect: usip: want no arguments, got 1: yes"},
		{Input: "cache_redirect {\ncaches a:1 {\nx\n}\n}", ExpectedErr: "cache_redirect: caches takes no block, at Testfile:2"},

		// Durations: positive, with a unit.
		{Input: "cache_redirect {\ncache_fail_duration 10\n}", ExpectedErr: `cache_redirect: cache_fail_duration "10": want a positive duration, such as 250ms, 30s or 1d, at Testfile:2`},
		{Input: "cache_redirect {\ncache_timeout 0s\n}", ExpectedErr: `cache_redirect: cache_timeout "0s": want a positive duration`},
		{Input: "cache_redirect {\ncache_timeout -1s\n}", ExpectedErr: `cache_redirect: cache_timeout "-1s": want a positive duration`},

		{Input: "cache_redirect {\ncolour blue\n}", ExpectedErr: `cache_redirect: unknown option "colour", at Testfile:2`},
	}
	cfparsetest.Check(t, func() *cacheredirect.CacheRedirect { return new(cacheredirect.CacheRedirect) }, tests, nil)
}
