package diametermatch

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestUnmarshalCaddyfile runs in the CoreDNS setup_test style: each input
// either parses to the expected JSON config or fails with the expected text,
// which carries the module, option, value, file and line.
func TestUnmarshalCaddyfile(t *testing.T) {
	d := func(body string) string { return "diameter {\n" + body + "\n}" }
	tests := []struct {
		input       string
		expected    string
		expectedErr string
	}{
		{input: "diameter", expected: `{}`},
		{input: `diameter {
			application_id 0 16777238
			application_id 4
			command_code 257
			request true
			origin_host pgw*.example mme.example
			origin_host pcrf.example
			origin_realm example
		}`, expected: `{"application_ids":[0,16777238,4],"command_codes":[257],"request":true,` +
			`"origin_hosts":["pgw*.example","mme.example","pcrf.example"],"origin_realms":["example"]}`},
		{input: d("request false\ncommand_code 272 280\ncommand_code 4294967295"), expected: `{"command_codes":[272,280,4294967295],"request":false}`},

		{input: d("application_id gx"), expectedErr: `diameter matcher: application_id "gx": want a whole number from 0 to 4294967295, at Testfile:2`},
		{input: d("application_id 16777238x"), expectedErr: `diameter matcher: application_id "16777238x"`},
		{input: d("application_id 0x1000016"), expectedErr: `diameter matcher: application_id "0x1000016"`},
		{input: d("command_code 272 3x"), expectedErr: `diameter matcher: command_code "3x": want a whole number from 0 to 4294967295, at Testfile:2`},
		{input: d("command_code -1"), expectedErr: `diameter matcher: command_code "-1"`},
		{input: d("command_code 4294967296"), expectedErr: `diameter matcher: command_code "4294967296"`},
		{input: d("request maybe"), expectedErr: `diameter matcher: request "maybe": want true or false, at Testfile:2`},
		{input: d("request 1"), expectedErr: `diameter matcher: request "1": want true or false`},
		{input: d("request TRUE"), expectedErr: `diameter matcher: request "TRUE"`},

		{input: "diameter gx", expectedErr: "diameter matcher: want no arguments, got 1: gx, at Testfile:1"},
		{input: d("request true false"), expectedErr: "diameter matcher: request: want 1 argument, got 2: true false, at Testfile:2"},
		{input: d("request"), expectedErr: "diameter matcher: request: want 1 argument, got none"},
		{input: d("origin_host"), expectedErr: "diameter matcher: origin_host: want at least 1 argument, got none, at Testfile:2"},
		{input: d("origin_realm"), expectedErr: "diameter matcher: origin_realm: want at least 1 argument, got none"},
		{input: d("application_id"), expectedErr: "diameter matcher: application_id: want at least 1 argument, got none"},
		{input: d("command_code"), expectedErr: "diameter matcher: command_code: want at least 1 argument, got none"},
		{input: d("origin_host a {\nb\n}"), expectedErr: "diameter matcher: origin_host takes no block, at Testfile:2"},
		{input: d("request true {\nx\n}"), expectedErr: "diameter matcher: request takes no block, at Testfile:2"},

		{input: d("request true\ncommand_code 272\nrequest false"), expectedErr: "diameter matcher: request given twice (first at Testfile:2), at Testfile:4"},

		{input: d("colour blue"), expectedErr: `diameter matcher: unknown option "colour", at Testfile:2`},
	}
	for i, test := range tests {
		var m MatchDiameter
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v", i, test.expectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
			continue
		}
		if got, _ := json.Marshal(m); string(got) != test.expected {
			t.Errorf("test %d: got %s\nwant %s", i, got, test.expected)
		}
	}
}

func TestOriginGlobs(t *testing.T) {
	hosts := []string{"pgw*.example", "mme.example"}
	if !globs(hosts, "pgw7.example") || globs(hosts, "pcrf.example") {
		t.Fatal("origin host globs")
	}
	bad := MatchDiameter{OriginHosts: []string{"pgw[.example"}}
	if err := bad.Provision(caddy.Context{}); err == nil {
		t.Error("a bad glob was accepted")
	}
}
