package cacheredirect_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/cacheredirect"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		input       string
		expected    string // the JSON config
		expectedErr string // with the file and line; empty: must parse
	}{
		{input: "cache_redirect", expected: `{"caches":null,"origin":null}`},
		{input: `cache_redirect {
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
		}`, expected: `{"node":"l2a","caches":["10.0.2.5:6081","10.0.2.6:6081","10.0.2.7:6081"],"origin":["10.0.3.9:80"],` +
			`"client_ip_header":"Client-IP","trusted":["10.0.1.0/24"],"cache_peers":["10.0.2.0/24"],"methods":["GET","HEAD"],` +
			`"bypass_paths":["/api/*","*.php"],"bypass_cookies":["session"],"bypass_headers":{"Cache-Control":"*no-cache*","X-Debug":""},` +
			`"cache_fail_duration":10000000000,"cache_timeout":30000000000,` +
			`"origin_transport":{"tier_map_file":"tiers.json","node":"l2a","usip":true,"http":{"dial_timeout":2000000000}}}`},
		{input: "cache_redirect {\nports 20000-29999\n}", expected: `{"caches":null,"origin":null,"origin_transport":{"ports":"20000-29999"}}`},

		// Repeats: single options (the transport's too) once, bypass_header once per name.
		{input: "cache_redirect {\nnode a\nnode b\n}", expectedErr: "cache_redirect: node given twice (first at Testfile:2), at Testfile:3"},
		{input: "cache_redirect {\nclient_ip_header A\nclient_ip_header B\n}", expectedErr: "cache_redirect: client_ip_header given twice"},
		{input: "cache_redirect {\ncache_timeout 1s\ncaches a:1\ncache_timeout 2s\n}", expectedErr: "cache_redirect: cache_timeout given twice (first at Testfile:2), at Testfile:4"},
		{input: "cache_redirect {\nports 1-2\nports 3-4\n}", expectedErr: "cache_redirect: ports given twice"},
		{input: "cache_redirect {\ntier_map a\ntier_map b\n}", expectedErr: "cache_redirect: tier_map given twice"},
		{input: "cache_redirect {\nhttp {\n}\nhttp {\n}\n}", expectedErr: "cache_redirect: http given twice"},
		{input: "cache_redirect {\nbypass_header X-Debug\nbypass_header x-debug 1\n}", expectedErr: "cache_redirect: bypass_header X-Debug given twice (first at Testfile:2), at Testfile:3"},

		// Arguments.
		{input: "cache_redirect 10.0.2.5:6081", expectedErr: "cache_redirect: want no arguments, got 1: 10.0.2.5:6081, at Testfile:1"},
		{input: "cache_redirect {\nnode a b\n}", expectedErr: "cache_redirect: node: want 1 argument, got 2: a b, at Testfile:2"},
		{input: "cache_redirect {\nclient_ip_header\n}", expectedErr: "cache_redirect: client_ip_header: want 1 argument, got none"},
		{input: "cache_redirect {\ncache_timeout 1s 2s\n}", expectedErr: "cache_redirect: cache_timeout: want 1 argument, got 2: 1s 2s"},
		{input: "cache_redirect {\nbypass_header\n}", expectedErr: "cache_redirect: bypass_header: want 1 to 2 arguments, got none, at Testfile:2"},
		{input: "cache_redirect {\nbypass_header A b c\n}", expectedErr: "cache_redirect: bypass_header: want 1 to 2 arguments, got 3: A b c"},
		{input: "cache_redirect {\ncaches\n}", expectedErr: "cache_redirect: caches: want at least 1 argument, got none, at Testfile:2"},
		{input: "cache_redirect {\nusip yes\n}", expectedErr: "cache_redirect: usip: want no arguments, got 1: yes"},
		{input: "cache_redirect {\ncaches a:1 {\nx\n}\n}", expectedErr: "cache_redirect: caches takes no block, at Testfile:2"},

		// Durations: positive, with a unit.
		{input: "cache_redirect {\ncache_fail_duration 10\n}", expectedErr: `cache_redirect: cache_fail_duration "10": want a positive duration, such as 250ms, 30s or 1d, at Testfile:2`},
		{input: "cache_redirect {\ncache_timeout 0s\n}", expectedErr: `cache_redirect: cache_timeout "0s": want a positive duration`},
		{input: "cache_redirect {\ncache_timeout -1s\n}", expectedErr: `cache_redirect: cache_timeout "-1s": want a positive duration`},

		{input: "cache_redirect {\ncolour blue\n}", expectedErr: `cache_redirect: unknown option "colour", at Testfile:2`},
	}
	for i, test := range tests {
		c := new(cacheredirect.CacheRedirect)
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v", i, test.expectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
		} else if got, _ := json.Marshal(c); string(got) != test.expected {
			t.Errorf("test %d: got %s\nwant %s", i, got, test.expected)
		}
	}
}
