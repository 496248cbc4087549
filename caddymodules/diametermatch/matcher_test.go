package diametermatch

import (
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

// TestUnmarshalCaddyfile runs in the CoreDNS setup_test style: each input
// either parses to the expected JSON config or fails with the expected text,
// which carries the module, option, value, file and line.
func TestUnmarshalCaddyfile(t *testing.T) {
	d := func(body string) string { return "diameter {\n" + body + "\n}" }
	tests := []cfparsetest.Case{
		{Input: "diameter", Expected: `{}`},
		{Input: `diameter {
			application_id 0 16777238
			application_id 4
			command_code 257
			request true
			origin_host pgw*.example mme.example
			origin_host pcrf.example
			origin_realm example
		}`, Expected: `{"application_ids":[0,16777238,4],"command_codes":[257],"request":true,` +
			`"origin_hosts":["pgw*.example","mme.example","pcrf.example"],"origin_realms":["example"]}`},
		{Input: d("request false\ncommand_code 272 280\ncommand_code 4294967295"), Expected: `{"command_codes":[272,280,4294967295],"request":false}`},

		{Input: d("application_id gx"), ExpectedErr: `diameter matcher: application_id "gx": want a whole number from 0 to 4294967295, at Testfile:2`},
		{Input: d("application_id 16777238x"), ExpectedErr: `diameter matcher: application_id "16777238x"`},
		{Input: d("application_id 0x1000016"), ExpectedErr: `diameter matcher: application_id "0x1000016"`},
		{Input: d("command_code 272 3x"), ExpectedErr: `diameter matcher: command_code "3x": want a whole number from 0 to 4294967295, at Testfile:2`},
		{Input: d("command_code -1"), ExpectedErr: `diameter matcher: command_code "-1"`},
		{Input: d("command_code 4294967296"), ExpectedErr: `diameter matcher: command_code "4294967296"`},
		{Input: d("request maybe"), ExpectedErr: `diameter matcher: request "maybe": want true or false, at Testfile:2`},
		{Input: d("request 1"), ExpectedErr: `diameter matcher: request "1": want true or false`},
		{Input: d("request TRUE"), ExpectedErr: `diameter matcher: request "TRUE"`},

		{Input: "diameter gx", ExpectedErr: "diameter matcher: want no arguments, got 1: gx, at Testfile:1"},
		{Input: d("request true false"), ExpectedErr: "diameter matcher: request: want 1 argument, got 2: true false, at Testfile:2"},
		{Input: d("request"), ExpectedErr: "diameter matcher: request: want 1 argument, got none"},
		{Input: d("origin_host"), ExpectedErr: "diameter matcher: origin_host: want at least 1 argument, got none, at Testfile:2"},
		{Input: d("origin_realm"), ExpectedErr: "diameter matcher: origin_realm: want at least 1 argument, got none"},
		{Input: d("application_id"), ExpectedErr: "diameter matcher: application_id: want at least 1 argument, got none"},
		{Input: d("command_code"), ExpectedErr: "diameter matcher: command_code: want at least 1 argument, got none"},
		{Input: d("origin_host a {\nb\n}"), ExpectedErr: "diameter matcher: origin_host takes no block, at Testfile:2"},
		{Input: d("request true {\nx\n}"), ExpectedErr: "diameter matcher: request takes no block, at Testfile:2"},

		{Input: d("request true\ncommand_code 272\nrequest false"), ExpectedErr: "diameter matcher: request given twice (first at Testfile:2), at Testfile:4"},

		{Input: d("colour blue"), ExpectedErr: `diameter matcher: unknown option "colour", at Testfile:2`},
	}
	cfparsetest.Check(t, func() *MatchDiameter { return new(MatchDiameter) }, tests, nil)
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
