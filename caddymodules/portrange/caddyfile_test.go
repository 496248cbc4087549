package portrange_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/portrange"
)

// checkParse runs table tests in the CoreDNS setup_test style: each input
// either parses to the expected JSON or fails with the expected text (which
// carries the file and line).
func checkParse(t *testing.T, fresh func() caddyfile.Unmarshaler, tests []parseTest) {
	t.Helper()
	for i, test := range tests {
		m := fresh()
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v", i, test.expectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
		} else if got, _ := json.Marshal(m); string(got) != test.expected {
			t.Errorf("test %d: got %s\nwant %s", i, got, test.expected)
		}
	}
}

type parseTest struct {
	input       string
	expected    string // the JSON config
	expectedErr string // empty: must parse
}

func TestMatcherUnmarshalCaddyfile(t *testing.T) {
	checkParse(t, func() caddyfile.Unmarshaler { return new(portrange.MatchPortRange) }, []parseTest{
		{input: "port_range 3000", expected: `{"ports":["3000"]}`},
		{input: "port_range local 1024-2047 3000", expected: `{"side":"local","ports":["1024-2047","3000"]}`},
		{input: "port_range remote 1-2 {\nports 3-4 5\nports 6\n}", expected: `{"side":"remote","ports":["1-2","3-4","5","6"]}`},
		{input: "port_range {\nside local\ntier_map tiers.json\nnode l2b\n}", expected: `{"side":"local","tier_map_file":"tiers.json","node":"l2b"}`},

		{input: "port_range {\nside local remote\n}", expectedErr: "port_range matcher: side: want 1 argument, got 2: local remote, at Testfile:2"},
		{input: "port_range {\nside local\nside remote\n}", expectedErr: "port_range matcher: side given twice (first at Testfile:2), at Testfile:3"},
		{input: "port_range local {\nside remote\n}", expectedErr: "port_range matcher: side: given twice (first on the matcher's line), at Testfile:2"},
		{input: "port_range {\nnode a\nnode b\n}", expectedErr: "port_range matcher: node given twice (first at Testfile:2), at Testfile:3"},
		{input: "port_range {\nnode a b\n}", expectedErr: "port_range matcher: node: want 1 argument, got 2: a b, at Testfile:2"},
		{input: "port_range {\ntier_map a.json\ntier_map b.json\n}", expectedErr: "port_range matcher: tier_map given twice"},
		{input: "port_range {\ntier_map\n}", expectedErr: "port_range matcher: tier_map: want 1 argument, got none, at Testfile:2"},
		{input: "port_range {\nports\n}", expectedErr: "port_range matcher: ports: want at least 1 argument, got none"},
		{input: "port_range {\ncolour blue\n}", expectedErr: `port_range matcher: unknown option "colour", at Testfile:2`},
	})
}

func TestTransportUnmarshalCaddyfile(t *testing.T) {
	checkParse(t, func() caddyfile.Unmarshaler { return new(portrange.Transport) }, []parseTest{
		{input: "port_range", expected: `{}`},
		{input: "port_range {\nports 20000-29999\nlocal_ip 127.0.0.1\nusip\nhttp {\nkeepalive 90s\n}\n}",
			expected: `{"ports":"20000-29999","local_ip":"127.0.0.1","usip":true,"http":{"keep_alive":{"idle_timeout":90000000000}}}`},
		{input: "port_range {\ntier_map t.json\nnode l2a\n}", expected: `{"tier_map_file":"t.json","node":"l2a"}`},

		{input: "port_range 2000-3000", expectedErr: "port_range transport: want no arguments, got 1: 2000-3000, at Testfile:1"},
		{input: "port_range {\nports 2000-3000 4000-5000\n}", expectedErr: "port_range transport: ports: want 1 argument, got 2: 2000-3000 4000-5000, at Testfile:2"},
		{input: "port_range {\nports 2000-3000\nports 4000-5000\n}", expectedErr: "port_range transport: ports given twice (first at Testfile:2), at Testfile:3"},
		{input: "port_range {\nlocal_ip 127.0.0.1 127.0.0.2\n}", expectedErr: "port_range transport: local_ip: want 1 argument, got 2"},
		{input: "port_range {\nusip on\n}", expectedErr: "port_range transport: usip: want no arguments, got 1: on, at Testfile:2"},
		{input: "port_range {\nusip\nusip\n}", expectedErr: "port_range transport: usip given twice"},
		{input: "port_range {\nhttp h2 {\nkeepalive 90s\n}\n}", expectedErr: "port_range transport: http: want no arguments, got 1: h2, at Testfile:2"},
		{input: "port_range {\nhttp {\n}\nhttp {\n}\n}", expectedErr: "port_range transport: http given twice (first at Testfile:2), at Testfile:4"},
		{input: "port_range {\nnode a\nnode a\n}", expectedErr: "port_range transport: node given twice"},
		{input: "port_range {\ncolour blue\n}", expectedErr: `port_range transport: unknown option "colour", at Testfile:2`},
	})
}
