package peerratelimit

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // the wrapped http transport, the HTTP matchers
)

// parseCase is one Caddyfile input (CoreDNS setup_test style): it parses
// to the expected JSON config or fails with an error containing
// expectedErr, which names the module, option, value, file and line.
type parseCase struct {
	input       string
	expected    string
	expectedErr string
}

func runParseCases(t *testing.T, tests []parseCase, parse func(*caddyfile.Dispenser) (any, error)) {
	t.Helper()
	for i, test := range tests {
		v, err := parse(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v\ninput: %s", i, test.expectedErr, err, test.input)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v\ninput: %s", i, err, test.input)
			continue
		}
		if got, _ := json.Marshal(v); string(got) != test.expected {
			t.Errorf("test %d: got %s\nwant %s", i, got, test.expected)
		}
	}
}

func TestUnmarshalCaddyfileHTTP(t *testing.T) {
	p := func(body string) string { return "peer_rate_limit {\nprofile p {\n" + body + "\n}\n}" }
	dyn := func(body string) string { return "peer_rate_limit {\ndynamic {\n" + body + "\n}\n}" }
	tests := []parseCase{
		{input: "peer_rate_limit", expected: `{"profiles":null}`},
		{input: `peer_rate_limit {
			name edge
			profile pGW2 {
				peer {http.request.header.Origin-Host}
				missing_peer refuse
				select {http.request.header.X-Peer} pgw* mme.example
				peer_cidr 10.0.0.0/8 192.0.2.1
				peer_cidr 2001:db8::/32
				rate 1000/s 50
				message gx-ccr-i {
					match {
						header X-Cc-Request-Type 1
					}
					rate 200
					dynamic
				}
				message gx-ccr-t {
					rate 2.5 3
				}
				action reject 503 "slow down"
				max_peers 500
				dynamic
			}
			profile other {
				rate 10
				action drop
			}
			dynamic {
				source prometheus http://127.0.0.1:9090 cpu job=node instance=a
				interval 2s
				threshold 55 30
				threshold 70.5 60
				reversal 40
				reversal_hold 30s
				reversal_step 20
			}
		}`, expected: `{"name":"edge","profiles":[{"name":"pGW2","peer":"{http.request.header.Origin-Host}","missing_peer":"refuse",` +
			`"peer_cidrs":["10.0.0.0/8","192.0.2.1","2001:db8::/32"],"select":{"placeholder":"{http.request.header.X-Peer}","values":["pgw*","mme.example"]},` +
			`"rate":1000,"burst":50,"messages":[{"type":"gx-ccr-i","match":{"header":{"X-Cc-Request-Type":["1"]}},"rate":200,"dynamic":true},` +
			`{"type":"gx-ccr-t","rate":2.5,"burst":3}],"action":"reject","status":503,"message":"slow down","max_peers":500,"dynamic":true},` +
			`{"name":"other","rate":10,"action":"drop"}],` +
			`"dynamic":{"source":"prometheus","url":"http://127.0.0.1:9090","metric":"cpu","labels":{"instance":"a","job":"node"},` +
			`"interval":2000000000,"thresholds":[{"load":55,"throttle":30},{"load":70.5,"throttle":60}],"reversal":40,"reversal_hold":30000000000,"reversal_step":20}}`},
		{input: p("rate 10\naction reject"), expected: `{"profiles":[{"name":"p","rate":10,"action":"reject"}]}`},
		{input: p("rate 10\naction reject 0 refused"), expected: `{"profiles":[{"name":"p","rate":10,"action":"reject","message":"refused"}]}`},
		{input: p("rate 1e3\naction reject 429"), expected: `{"profiles":[{"name":"p","rate":1000,"action":"reject","status":429}]}`},
		{input: dyn("source procstat"), expected: `{"profiles":null,"dynamic":{"source":"procstat","thresholds":null}}`},
		{input: dyn("source file /run/load"), expected: `{"profiles":null,"dynamic":{"source":"file","path":"/run/load","thresholds":null}}`},

		// Loose numbers, durations and words.
		{input: p("rate 3x"), expectedErr: `peer_rate_limit: profile: rate "3x": want a positive number per second, at Testfile:3`},
		{input: p("rate 0x10"), expectedErr: `peer_rate_limit: profile: rate "0x10": want a positive number per second, at Testfile:3`},
		{input: p("rate 0x1p4"), expectedErr: `rate "0x1p4"`},
		{input: p("rate 0"), expectedErr: `peer_rate_limit: profile: rate "0": want a positive number per second`},
		{input: p("rate -5"), expectedErr: `rate "-5"`},
		{input: p("rate Inf"), expectedErr: `rate "Inf"`},
		{input: p("rate NaN"), expectedErr: `rate "NaN"`},
		{input: p("rate 10/m"), expectedErr: `rate "10/m"`},
		{input: p("rate 10 5x"), expectedErr: `peer_rate_limit: profile: rate: burst "5x": want a whole number of at least 1, at Testfile:3`},
		{input: p("rate 10 0x10"), expectedErr: `burst "0x10"`},
		{input: p("rate 10 0"), expectedErr: `burst "0"`},
		{input: p("rate 10\nmax_peers 3x"), expectedErr: `peer_rate_limit: profile: max_peers "3x": want a whole number of at least 1, at Testfile:4`},
		{input: p("rate 10\nmax_peers 0x10"), expectedErr: `max_peers "0x10"`},
		{input: p("rate 10\nmax_peers 1_000"), expectedErr: `max_peers "1_000"`},
		{input: p("rate 10\nmax_peers 0"), expectedErr: `max_peers "0"`},
		{input: p("rate 10\naction reject 429x"), expectedErr: `peer_rate_limit: profile: action: reject status "429x": want 0 (the default) or a whole number from 400 to 599, at Testfile:4`},
		{input: p("rate 10\naction reject 0x1ad"), expectedErr: `reject status "0x1ad"`},
		{input: p("rate 10\naction reject 200"), expectedErr: `reject status "200"`},
		{input: p("rate 10\naction reject -1"), expectedErr: `reject status "-1"`},
		{input: p("rate 10\naction reject 600"), expectedErr: `reject status "600"`},
		{input: p("rate 10\naction bounce"), expectedErr: `peer_rate_limit: profile: action "bounce": want reject [<status> [<message>]] or drop, at Testfile:4`},
		{input: p("rate 10\naction drop 429"), expectedErr: `action "drop 429"`},
		{input: p("message m {\nrate 5x\n}"), expectedErr: `peer_rate_limit: profile: message: rate "5x": want a positive number per second, at Testfile:4`},
		{input: dyn("interval 5"), expectedErr: `peer_rate_limit: dynamic: interval "5": want a positive duration, such as 250ms, 30s or 1d, at Testfile:3`},
		{input: dyn("interval 0s"), expectedErr: `interval "0s"`},
		{input: dyn("reversal_hold 30sx"), expectedErr: `reversal_hold "30sx"`},
		{input: dyn("threshold 55x 30"), expectedErr: `peer_rate_limit: dynamic: threshold "55x": want a decimal number from 0 to 100, at Testfile:3`},
		{input: dyn("threshold 0x37 30"), expectedErr: `threshold "0x37"`},
		{input: dyn("threshold 155 30"), expectedErr: `threshold "155"`},
		{input: dyn("threshold 55 3x"), expectedErr: `peer_rate_limit: dynamic: threshold: 55: throttle "3x": want a whole number from 0 to 100, at Testfile:3`},
		{input: dyn("threshold 55 0x10"), expectedErr: `throttle "0x10"`},
		{input: dyn("threshold 55 130"), expectedErr: `throttle "130"`},
		{input: dyn("reversal 4x"), expectedErr: `peer_rate_limit: dynamic: reversal "4x": want a decimal number from 0 to 100`},
		{input: dyn("reversal_step 2x"), expectedErr: `peer_rate_limit: dynamic: reversal_step "2x": want a whole number from 1 to 100`},
		{input: dyn("reversal_step 0"), expectedErr: `reversal_step "0"`},
		{input: dyn("source snmp"), expectedErr: `peer_rate_limit: dynamic: source "snmp": want prometheus`},
		{input: dyn("source procstat extra"), expectedErr: `source "procstat extra"`},
		{input: dyn("source file"), expectedErr: `source "file"`},
		{input: dyn("source prometheus http://x cpu job"), expectedErr: `peer_rate_limit: dynamic: source: label "job": want name=value`},
		{input: dyn("source prometheus http://x cpu job=a job=b"), expectedErr: `source: label job given twice`},

		// Extra and missing arguments, blocks after options that take none.
		{input: "peer_rate_limit edge", expectedErr: "peer_rate_limit: want no arguments, got 1: edge, at Testfile:1"},
		{input: "peer_rate_limit {\nname a b\n}", expectedErr: "peer_rate_limit: name: want 1 argument, got 2: a b, at Testfile:2"},
		{input: "peer_rate_limit {\nname\n}", expectedErr: "peer_rate_limit: name: want 1 argument, got none"},
		{input: "peer_rate_limit {\nname a {\nb\n}\n}", expectedErr: "peer_rate_limit: name takes no block, at Testfile:2"},
		{input: "peer_rate_limit {\nprofile {\nrate 1\n}\n}", expectedErr: "peer_rate_limit: profile: want 1 argument, got none, at Testfile:2"},
		{input: "peer_rate_limit {\nprofile a b {\nrate 1\n}\n}", expectedErr: "peer_rate_limit: profile: want 1 argument, got 2: a b"},
		{input: "peer_rate_limit {\ndynamic procstat\n}", expectedErr: "peer_rate_limit: dynamic: want no arguments, got 1: procstat"},
		{input: p("peer {a} {b}"), expectedErr: "peer_rate_limit: profile: peer: want 1 argument, got 2: {a} {b}, at Testfile:3"},
		{input: p("peer"), expectedErr: "peer_rate_limit: profile: peer: want 1 argument, got none"},
		{input: p("missing_peer refuse now"), expectedErr: "peer_rate_limit: profile: missing_peer: want 1 argument, got 2"},
		{input: p("select {http.request.header.X-Peer}"), expectedErr: "peer_rate_limit: profile: select: want at least 2 arguments, got 1"},
		{input: p("peer_cidr"), expectedErr: "peer_rate_limit: profile: peer_cidr: want at least 1 argument, got none"},
		{input: p("rate"), expectedErr: "peer_rate_limit: profile: rate: want 1 to 2 arguments, got none"},
		{input: p("rate 10 5 7"), expectedErr: "peer_rate_limit: profile: rate: want 1 to 2 arguments, got 3: 10 5 7, at Testfile:3"},
		{input: p("rate 10 {\nburst 5\n}"), expectedErr: "peer_rate_limit: profile: rate takes no block, at Testfile:3"},
		{input: p("rate 10\naction"), expectedErr: "peer_rate_limit: profile: action: want 1 to 3 arguments, got none"},
		{input: p("rate 10\naction reject 429 slow extra"), expectedErr: "peer_rate_limit: profile: action: want 1 to 3 arguments, got 4"},
		{input: p("rate 10\ndynamic true"), expectedErr: "peer_rate_limit: profile: dynamic: want no arguments, got 1: true"},
		{input: p("rate 10\nmax_peers 5 6"), expectedErr: "peer_rate_limit: profile: max_peers: want 1 argument, got 2"},
		{input: p("message {\nrate 1\n}"), expectedErr: "peer_rate_limit: profile: message: want 1 argument, got none"},
		{input: p("message a b {\nrate 1\n}"), expectedErr: "peer_rate_limit: profile: message: want 1 argument, got 2: a b"},
		{input: p("message m {\nrate 5 1 2\n}"), expectedErr: "peer_rate_limit: profile: message: rate: want 1 to 2 arguments, got 3"},
		{input: p("message m {\nrate 5\ndynamic yes\n}"), expectedErr: "peer_rate_limit: profile: message: dynamic: want no arguments, got 1: yes"},
		{input: dyn("interval 1s 2s"), expectedErr: "peer_rate_limit: dynamic: interval: want 1 argument, got 2: 1s 2s"},
		{input: dyn("threshold 55"), expectedErr: "peer_rate_limit: dynamic: threshold: want 2 arguments, got 1: 55"},
		{input: dyn("threshold 55 30 10"), expectedErr: "peer_rate_limit: dynamic: threshold: want 2 arguments, got 3"},
		{input: dyn("reversal"), expectedErr: "peer_rate_limit: dynamic: reversal: want 1 argument, got none"},
		{input: dyn("reversal_step 5 5"), expectedErr: "peer_rate_limit: dynamic: reversal_step: want 1 argument, got 2"},
		{input: dyn("source"), expectedErr: "peer_rate_limit: dynamic: source: want at least 1 argument, got none"},

		// Repeats: profile (once per name), peer_cidr, message (once per
		// type) and threshold add up; every other option is given once.
		{input: "peer_rate_limit {\nname a\nname b\n}", expectedErr: "peer_rate_limit: name given twice (first at Testfile:2), at Testfile:3"},
		{input: "peer_rate_limit {\nprofile p {\nrate 1\n}\nprofile q {\nrate 2\n}\nprofile p {\nrate 3\n}\n}",
			expectedErr: "peer_rate_limit: profile p given twice (first at Testfile:2), at Testfile:8"},
		{input: "peer_rate_limit {\ndynamic {\nsource procstat\n}\ndynamic {\nsource procstat\n}\n}", expectedErr: "peer_rate_limit: dynamic given twice (first at Testfile:2), at Testfile:5"},
		{input: p("rate 10\nrate 20"), expectedErr: "peer_rate_limit: profile: rate given twice (first at Testfile:3), at Testfile:4"},
		{input: p("peer {a}\npeer {b}\nrate 1"), expectedErr: "peer_rate_limit: profile: peer given twice"},
		{input: p("missing_peer refuse\nmissing_peer fallback"), expectedErr: "peer_rate_limit: profile: missing_peer given twice"},
		{input: p("select {a} x\nselect {a} y"), expectedErr: "peer_rate_limit: profile: select given twice"},
		{input: p("rate 10\naction drop\naction reject"), expectedErr: "peer_rate_limit: profile: action given twice (first at Testfile:4), at Testfile:5"},
		{input: p("rate 10\ndynamic\ndynamic"), expectedErr: "peer_rate_limit: profile: dynamic given twice"},
		{input: p("rate 10\nmax_peers 5\nmax_peers 6"), expectedErr: "peer_rate_limit: profile: max_peers given twice"},
		{input: p("message m {\nrate 1\n}\nmessage n {\nrate 1\n}\nmessage m {\nrate 2\n}"),
			expectedErr: "peer_rate_limit: profile: message m given twice (first at Testfile:3), at Testfile:9"},
		{input: p("message m {\nrate 1\nrate 2\n}"), expectedErr: "peer_rate_limit: profile: message: rate given twice (first at Testfile:4), at Testfile:5"},
		{input: p("message m {\nrate 1\ndynamic\ndynamic\n}"), expectedErr: "peer_rate_limit: profile: message: dynamic given twice"},
		{input: p("message m {\nmatch {\npath /a\n}\nmatch {\npath /b\n}\nrate 1\n}"), expectedErr: "peer_rate_limit: profile: message: match given twice (first at Testfile:4), at Testfile:7"},
		{input: dyn("source procstat\nsource file /x"), expectedErr: "peer_rate_limit: dynamic: source given twice (first at Testfile:3), at Testfile:4"},
		{input: dyn("interval 1s\ninterval 2s"), expectedErr: "peer_rate_limit: dynamic: interval given twice"},
		{input: dyn("reversal 10\nreversal 20"), expectedErr: "peer_rate_limit: dynamic: reversal given twice"},
		{input: dyn("reversal_hold 1s\nreversal_hold 2s"), expectedErr: "peer_rate_limit: dynamic: reversal_hold given twice"},
		{input: dyn("reversal_step 5\nreversal_step 6"), expectedErr: "peer_rate_limit: dynamic: reversal_step given twice"},

		{input: "peer_rate_limit {\ncolour blue\n}", expectedErr: `peer_rate_limit: unknown option "colour", at Testfile:2`},
		{input: "peer_rate_limit {\ndiameter {\norigin_host a\n}\n}", expectedErr: `peer_rate_limit: unknown option "diameter", at Testfile:2`},
		{input: p("rate 10\ncolour blue"), expectedErr: `peer_rate_limit: profile: unknown option "colour", at Testfile:4`},
		{input: p("message m {\nrate 1\ncolour blue\n}"), expectedErr: `peer_rate_limit: profile: message: unknown option "colour", at Testfile:5`},
		{input: dyn("colour blue"), expectedErr: `peer_rate_limit: dynamic: unknown option "colour", at Testfile:3`},
	}
	runParseCases(t, tests, func(d *caddyfile.Dispenser) (any, error) {
		var h HTTPHandler
		return &h, h.UnmarshalCaddyfile(d)
	})
}

func TestUnmarshalCaddyfileLayer4(t *testing.T) {
	diam := func(body string) string {
		return "peer_rate_limit {\ndiameter {\n" + body + "\n}\nprofile p {\nrate 10\n}\n}"
	}
	tests := []parseCase{
		{input: `peer_rate_limit {
			name dra
			diameter {
				origin_host dra.example
				origin_realm example
				result_code 3004
				error_message "too busy"
				max_length 65536
				max_queued_refusals 16
				refusal_wait 2s
			}
			profile pgw {
				peer_cidr 127.0.0.1
				rate 100 10
				message gx-ccr-i {
					rate 5
					dynamic
				}
				action reject 429 "busy"
			}
		}`, expected: `{"name":"dra","profiles":[{"name":"pgw","peer_cidrs":["127.0.0.1"],"rate":100,"burst":10,` +
			`"messages":[{"type":"gx-ccr-i","rate":5,"dynamic":true}],"action":"reject","status":429,"message":"busy"}],` +
			`"diameter":{"origin_host":"dra.example","origin_realm":"example","result_code":3004,"error_message":"too busy",` +
			`"max_length":65536,"max_queued_refusals":16,"refusal_wait":2000000000}}`},
		{input: "peer_rate_limit {\nprofile conns {\nrate 5\naction drop\n}\n}", expected: `{"profiles":[{"name":"conns","rate":5,"action":"drop"}]}`},

		{input: diam("result_code 3002x"), expectedErr: `peer_rate_limit: diameter: result_code "3002x": want a whole number from 0 to 4294967295, at Testfile:3`},
		{input: diam("result_code 0xbba"), expectedErr: `result_code "0xbba"`},
		{input: diam("result_code 4294967297"), expectedErr: `result_code "4294967297"`},
		{input: diam("max_length 4k"), expectedErr: `peer_rate_limit: diameter: max_length "4k": want a whole number of at least 0`},
		{input: diam("max_queued_refusals -1"), expectedErr: `max_queued_refusals "-1"`},
		{input: diam("max_queued_refusals 0x10"), expectedErr: `max_queued_refusals "0x10"`},
		{input: diam("refusal_wait 5"), expectedErr: `peer_rate_limit: diameter: refusal_wait "5": want a positive duration`},
		{input: diam("refusal_wait 0s"), expectedErr: `refusal_wait "0s"`},
		{input: diam("refusal_wait soon"), expectedErr: `refusal_wait "soon"`},

		{input: "peer_rate_limit {\ndiameter on {\norigin_host a\n}\n}", expectedErr: "peer_rate_limit: diameter: want no arguments, got 1: on, at Testfile:2"},
		{input: diam("origin_host a b"), expectedErr: "peer_rate_limit: diameter: origin_host: want 1 argument, got 2: a b, at Testfile:3"},
		{input: diam("origin_realm"), expectedErr: "peer_rate_limit: diameter: origin_realm: want 1 argument, got none"},
		{input: diam(`error_message too busy`), expectedErr: "peer_rate_limit: diameter: error_message: want 1 argument, got 2: too busy"},
		{input: diam("result_code 3002 3004"), expectedErr: "peer_rate_limit: diameter: result_code: want 1 argument, got 2"},
		{input: diam("refusal_wait 1s {\nx\n}"), expectedErr: "peer_rate_limit: diameter: refusal_wait takes no block, at Testfile:3"},

		{input: "peer_rate_limit {\ndiameter {\norigin_host a\n}\ndiameter {\norigin_host b\n}\n}",
			expectedErr: "peer_rate_limit: diameter given twice (first at Testfile:2), at Testfile:5"},
		{input: diam("origin_host a\norigin_host b"), expectedErr: "peer_rate_limit: diameter: origin_host given twice (first at Testfile:3), at Testfile:4"},
		{input: diam("origin_realm a\norigin_realm b"), expectedErr: "peer_rate_limit: diameter: origin_realm given twice"},
		{input: diam("result_code 3002\nresult_code 3004"), expectedErr: "peer_rate_limit: diameter: result_code given twice"},
		{input: diam("error_message a\nerror_message b"), expectedErr: "peer_rate_limit: diameter: error_message given twice"},
		{input: diam("max_length 100\nmax_length 200"), expectedErr: "peer_rate_limit: diameter: max_length given twice"},
		{input: diam("max_queued_refusals 1\nmax_queued_refusals 2"), expectedErr: "peer_rate_limit: diameter: max_queued_refusals given twice"},
		{input: diam("refusal_wait 1s\nrefusal_wait 2s"), expectedErr: "peer_rate_limit: diameter: refusal_wait given twice"},
		{input: "peer_rate_limit {\nprofile p {\nrate 1\n}\nprofile p {\nrate 2\n}\n}", expectedErr: "peer_rate_limit: profile p given twice (first at Testfile:2), at Testfile:5"},
		{input: "peer_rate_limit {\nprofile p {\nmessage gx-ccr-i {\nrate 1\n}\nmessage gx-ccr-i {\nrate 2\n}\n}\n}", expectedErr: "peer_rate_limit: profile: message gx-ccr-i given twice"},

		{input: diam("colour blue"), expectedErr: `peer_rate_limit: diameter: unknown option "colour", at Testfile:3`},
		// Layer 4 messages have no HTTP matchers.
		{input: "peer_rate_limit {\nprofile p {\nmessage m {\nmatch {\npath /x\n}\nrate 1\n}\n}\n}", expectedErr: `peer_rate_limit: profile: message: unknown option "match", at Testfile:4`},
	}
	runParseCases(t, tests, func(d *caddyfile.Dispenser) (any, error) {
		var h L4Handler
		return &h, h.UnmarshalCaddyfile(d)
	})
}

func TestUnmarshalCaddyfileEgress(t *testing.T) {
	g := func(body string) string { return "peer_rate_limit {\ngroup g 10.0.0.1:80 {\n" + body + "\n}\n}" }
	tests := []parseCase{
		{input: `peer_rate_limit {
			name out
			group pcrf 10.0.0.1:80 10.0.0.2:80 {
				rate 100
				message ccr {
					match {
						path /ccr
					}
					rate 10 2
				}
				action reject 503
				max_peers 10
			}
			group ocs 10.0.0.3:80 {
				rate 5
				action drop
			}
			transport http {
				dial_timeout 2s
			}
		}`, expected: `{"name":"out","groups":[{"name":"pcrf","rate":100,"messages":[{"type":"ccr","match":{"path":["/ccr"]},"rate":10,"burst":2}],` +
			`"action":"reject","status":503,"max_peers":10,"upstreams":["10.0.0.1:80","10.0.0.2:80"]},` +
			`{"name":"ocs","rate":5,"action":"drop","upstreams":["10.0.0.3:80"]}],"transport":{"dial_timeout":2000000000,"protocol":"http"}}`},

		{input: "peer_rate_limit extra", expectedErr: "peer_rate_limit: transport: want no arguments, got 1: extra, at Testfile:1"},
		{input: "peer_rate_limit {\ngroup g {\nrate 1\n}\n}", expectedErr: "peer_rate_limit: transport: group: want at least 2 arguments, got 1: g, at Testfile:2"},
		{input: "peer_rate_limit {\nname a b\n}", expectedErr: "peer_rate_limit: transport: name: want 1 argument, got 2: a b"},
		{input: "peer_rate_limit {\ntransport\n}", expectedErr: "peer_rate_limit: transport: transport: want 1 argument, got none"},
		{input: "peer_rate_limit {\ntransport http h2c\n}", expectedErr: "peer_rate_limit: transport: transport: want 1 argument, got 2: http h2c"},
		{input: g("rate 3x"), expectedErr: `peer_rate_limit: transport: group: rate "3x": want a positive number per second, at Testfile:3`},
		{input: g("rate 10\nmax_peers 0x10"), expectedErr: `peer_rate_limit: transport: group: max_peers "0x10"`},
		{input: g("rate 10 5 5"), expectedErr: "peer_rate_limit: transport: group: rate: want 1 to 2 arguments, got 3"},

		{input: "peer_rate_limit {\nname a\nname b\n}", expectedErr: "peer_rate_limit: transport: name given twice (first at Testfile:2), at Testfile:3"},
		{input: "peer_rate_limit {\ngroup g 10.0.0.1:80 {\nrate 1\n}\ngroup g 10.0.0.2:80 {\nrate 1\n}\n}", expectedErr: "peer_rate_limit: transport: group g given twice (first at Testfile:2), at Testfile:5"},
		{input: "peer_rate_limit {\ntransport http\ntransport http\n}", expectedErr: "peer_rate_limit: transport: transport given twice (first at Testfile:2), at Testfile:3"},
		{input: "peer_rate_limit {\ndynamic {\nsource procstat\n}\ndynamic {\nsource procstat\n}\n}", expectedErr: "peer_rate_limit: transport: dynamic given twice"},
		{input: g("rate 1\nrate 2"), expectedErr: "peer_rate_limit: transport: group: rate given twice (first at Testfile:3), at Testfile:4"},
		{input: g("message m {\nrate 1\n}\nmessage m {\nrate 1\n}"), expectedErr: "peer_rate_limit: transport: group: message m given twice"},

		{input: "peer_rate_limit {\ncolour blue\n}", expectedErr: `peer_rate_limit: transport: unknown option "colour", at Testfile:2`},
		{input: "peer_rate_limit {\ntransport nosuch\n}", expectedErr: `nosuch`},
	}
	runParseCases(t, tests, func(d *caddyfile.Dispenser) (any, error) {
		var tr EgressTransport
		return &tr, tr.UnmarshalCaddyfile(d)
	})
}
