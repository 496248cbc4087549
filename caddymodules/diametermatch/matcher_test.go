package diametermatch

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var m MatchDiameter
	err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`diameter {
		application_id 0 16777238
		command_code 257
		request true
		origin_host pgw*.example mme.example
		origin_realm example
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ApplicationIDs) != 2 || m.ApplicationIDs[1] != 16777238 || m.CommandCodes[0] != 257 ||
		m.Request == nil || !*m.Request || len(m.OriginHosts) != 2 || m.OriginRealms[0] != "example" {
		t.Fatalf("%+v", m)
	}
	if !globs(m.OriginHosts, "pgw7.example") || globs(m.OriginHosts, "pcrf.example") {
		t.Fatal("origin host globs")
	}
}

func TestUnmarshalErrorsNameOption(t *testing.T) {
	for body, want := range map[string]string{
		"application_id gx": `application_id "gx"`,
		"request maybe":     "request",
		"colour blue":       `unknown option "colour"`,
		"origin_host":       "wrong argument count",
	} {
		var m MatchDiameter
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser("diameter {\n" + body + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	bad := MatchDiameter{OriginHosts: []string{"pgw[.example"}}
	if err := bad.Provision(caddy.Context{}); err == nil {
		t.Error("a bad glob was accepted")
	}
}
