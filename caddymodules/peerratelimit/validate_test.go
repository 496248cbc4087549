package peerratelimit_test

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	_ "github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The worked example of a profile as a Caddyfile (pGW2: 1000/s overall,
// Gx CCR-I and CCR-T 200/s each) adapts to the JSON the handler reads.
func TestAdaptPGW2Example(t *testing.T) {
	cf := `http://127.0.0.1:8081 {
	peer_rate_limit {
		profile pGW2 {
			peer {http.request.header.Origin-Host}
			rate 1000
			message gx-ccr-i {
				match {
					header X-Cc-Request-Type 1
				}
				rate 200
			}
			message gx-ccr-t {
				match {
					header X-Cc-Request-Type 3
				}
				rate 200
			}
			action reject 429 "rate limit exceeded"
		}
	}
	respond ok
}`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"handler":"peer_rate_limit"`,
		`"messages":[{"match":{"header":{"X-Cc-Request-Type":["1"]}},"rate":200,"type":"gx-ccr-i"},{"match":{"header":{"X-Cc-Request-Type":["3"]}},"rate":200,"type":"gx-ccr-t"}]`,
		`"name":"pGW2","peer":"{http.request.header.Origin-Host}","rate":1000,"status":429`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
}

// Bad config fails `caddy validate`, naming the option and value.
func TestBadConfigFailsValidate(t *testing.T) {
	wrap := func(body string) string {
		return "http://127.0.0.1:1 {\n\tpeer_rate_limit {\n" + body + "\n\t}\n\trespond ok\n}\n"
	}
	prof := func(body string) string { return wrap("profile p {\n" + body + "\n}") }
	dyn := func(body string) string {
		return wrap("profile p {\nrate 10\nmessage m {\nmatch {\nmethod POST\n}\nrate 5\ndynamic\n}\n}\ndynamic {\nsource file /tmp/x\n" + body + "\n}")
	}
	orcaDyn := func(body string) string {
		return wrap("profile p {\nrate 10\ndynamic\n}\ndynamic {\n" + body + "\nthreshold 55 30\n}")
	}
	l4orca := "{\n\tlayer4 {\n\t\t127.0.0.1:1 {\n\t\t\troute {\n\t\t\t\tpeer_rate_limit {\nprofile p {\nrate 10\ndynamic\n}\n" +
		"dynamic {\nsource orca\nthreshold 55 30\n}\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n"
	l4diam := func(opt string) string {
		return "{\n\tlayer4 {\n\t\t127.0.0.1:1 {\n\t\t\troute {\n\t\t\t\tpeer_rate_limit {\n" +
			"diameter {\norigin_host a\norigin_realm b\n" + opt + "\n}\nprofile p {\nrate 10\n}\n" +
			"\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n"
	}
	for name, tc := range map[string]struct{ cf, want string }{
		"zero rate":              {prof("rate 0"), `rate "0"`},
		"negative rate":          {prof("rate -5"), `rate "-5"`},
		"no limit":               {prof("action drop"), "needs an overall rate or a message limit"},
		"unknown action":         {prof("rate 10\naction bounce"), `action "bounce": want reject [<status> [<message>]] or drop`},
		"bad status":             {prof("rate 10\naction reject 200"), `reject status "200": want 0 (the default) or a whole number from 400 to 599`},
		"bad cidr":               {prof("rate 10\npeer_cidr 10.0.0.0/99"), "peer_cidr 10.0.0.0/99"},
		"unknown option":         {prof("rate 10\ncolour blue"), `unknown option "colour"`},
		"threshold range":        {dyn("threshold 55 130"), `throttle "130": want a whole number from 0 to 100`},
		"threshold load":         {dyn("threshold 155 30"), `threshold "155": want a decimal number from 0 to 100`},
		"not monotonic":          {dyn("threshold 60 40\nthreshold 55 30"), "not monotonic"},
		"reversal too high":      {dyn("threshold 55 30\nreversal 70"), "reversal threshold 70%"},
		"bad url":                {wrap("profile p {\nrate 10\ndynamic\n}\ndynamic {\nsource prometheus ftp:/x cpu\nthreshold 55 30\n}"), "url"},
		"bad source":             {wrap("profile p {\nrate 10\ndynamic\n}\ndynamic {\nsource snmp\nthreshold 55 30\n}"), `dynamic: source "snmp": want prometheus`},
		"dynamic, no rule":       {wrap("profile p {\nrate 10\n}\ndynamic {\nsource procstat\nthreshold 55 30\n}"), "no limit is marked dynamic: mark a message limit (dynamic in its message block) or a profile's overall rate"},
		"select, no value":       {prof("rate 10\nselect {http.request.header.X-Peer}"), "profile: select: want at least 2 arguments, got 1"},
		"select, no placeholder": {prof("rate 10\nselect pgw1 pgw2"), `select "pgw1"`},
		"select, bad pattern":    {prof("rate 10\nselect {http.request.header.X-Peer} pgw[1"), `select {http.request.header.X-Peer} "pgw[1"`},
		"missing_peer":           {prof("rate 10\npeer {http.request.header.X-Peer}\nmissing_peer ignore"), `missing_peer "ignore"`},
		"orca aggregate":         {orcaDyn("source orca avg"), `peer_rate_limit: dynamic source orca "avg": want max or mean`},
		"orca blackout":          {orcaDyn("source orca\norca_blackout -1s"), `orca_blackout "-1s"`},
		"orca expiration":        {orcaDyn("source orca\norca_expiration 0s"), `orca_expiration "0s"`},
		"orca option, no orca":   {orcaDyn("source procstat\norca_blackout 1s"), "peer_rate_limit: dynamic orca_blackout 1s: applies to source orca only"},
		"orca in layer4":         {l4orca, "peer_rate_limit: dynamic source orca: reads the endpoint-load-metrics header of HTTP answers, and layer 4 has none"},
		"queue too long":         {l4diam("max_queued_refusals 70000"), "max_queued_refusals 70000"},
		"queue negative":         {l4diam("max_queued_refusals -1"), `max_queued_refusals "-1"`},
		"refusal_wait zero":      {l4diam("refusal_wait 0s"), `refusal_wait "0s"`},
		"refusal_wait junk":      {l4diam("refusal_wait soon"), `refusal_wait "soon"`},
		"cluster, no store":      {prof("rate 10\ncluster redis main"), `peer_rate_limit: profile p: cluster redis: no Redis store named "main": declare it with the edgesteer_redis global option`},
		"cluster, unknown store": {"{\n\tedgesteer_redis other {\n\t\taddress 127.0.0.1:1\n\t}\n}\n" + prof("rate 10\ncluster redis main"), `no Redis store named "main" (declared: other)`},
		"cluster, no rate":       {prof("message m {\nmatch {\nmethod POST\n}\nrate 5\n}\ncluster redis main"), "profile p: cluster redis main: a cluster-wide limit needs the profile's overall rate (rate)"},
		"cluster, short ttl":     {"{\n\tedgesteer_redis main {\n\t\taddress 127.0.0.1:1\n\t}\n}\n" + prof("rate 10\ncluster redis main {\nsync 1s\nreplica_ttl 500ms\n}"), "cluster replica_ttl 500ms: must be at least the sync interval 1s"},
	} {
		t.Run(name, func(t *testing.T) { e2e.ValidateFails(t, tc.cf, tc.want) })
	}
}
