package peerratelimit

import (
	"testing"

	_ "github.com/caddyserver/caddy/v2/modules/standard" // the wrapped http transport, the HTTP matchers

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

func TestUnmarshalCaddyfileHTTP(t *testing.T) {
	p := func(body string) string { return "peer_rate_limit {\nprofile p {\n" + body + "\n}\n}" }
	dyn := func(body string) string { return "peer_rate_limit {\ndynamic {\n" + body + "\n}\n}" }
	tests := []cfparsetest.Case{
		{Input: "peer_rate_limit", Expected: `{"profiles":null}`},
		{Input: `peer_rate_limit {
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
		}`, Expected: `{"name":"edge","profiles":[{"name":"pGW2","peer":"{http.request.header.Origin-Host}","missing_peer":"refuse",` +
			`"peer_cidrs":["10.0.0.0/8","192.0.2.1","2001:db8::/32"],"select":{"placeholder":"{http.request.header.X-Peer}","values":["pgw*","mme.example"]},` +
			`"rate":1000,"burst":50,"messages":[{"type":"gx-ccr-i","match":{"header":{"X-Cc-Request-Type":["1"]}},"rate":200,"dynamic":true},` +
			`{"type":"gx-ccr-t","rate":2.5,"burst":3}],"action":"reject","status":503,"message":"slow down","max_peers":500,"dynamic":true},` +
			`{"name":"other","rate":10,"action":"drop"}],` +
			`"dynamic":{"source":"prometheus","url":"http://127.0.0.1:9090","metric":"cpu","labels":{"instance":"a","job":"node"},` +
			`"interval":2000000000,"thresholds":[{"load":55,"throttle":30},{"load":70.5,"throttle":60}],"reversal":40,"reversal_hold":30000000000,"reversal_step":20}}`},
		{Input: p("rate 10\naction reject"), Expected: `{"profiles":[{"name":"p","rate":10,"action":"reject"}]}`},
		{Input: p("rate 10\naction reject 0 refused"), Expected: `{"profiles":[{"name":"p","rate":10,"action":"reject","message":"refused"}]}`},
		{Input: p("rate 1e3\naction reject 429"), Expected: `{"profiles":[{"name":"p","rate":1000,"action":"reject","status":429}]}`},
		{Input: dyn("source procstat"), Expected: `{"profiles":null,"dynamic":{"source":"procstat","thresholds":null}}`},
		{Input: dyn("source file /run/load"), Expected: `{"profiles":null,"dynamic":{"source":"file","path":"/run/load","thresholds":null}}`},
		{Input: dyn("source orca mean\norca_blackout 0s\norca_expiration 1m"), Expected: `{"profiles":null,"dynamic":{"source":"orca","aggregate":"mean","orca_blackout":0,"orca_expiration":60000000000,"thresholds":null}}`},
		{Input: dyn("source orca"), Expected: `{"profiles":null,"dynamic":{"source":"orca","thresholds":null}}`},
		{Input: dyn("source orca max mean"), ExpectedErr: `peer_rate_limit: dynamic: source "orca max mean": want prometheus <url> <metric> [label=value...], procstat, file <path>, or orca [max|mean]`},

		// Loose numbers, durations and words.
		{Input: p("rate 3x"), ExpectedErr: `peer_rate_limit: profile: rate "3x": want a positive number per second, at Testfile:3`},
		{Input: p("rate 0x10"), ExpectedErr: `peer_rate_limit: profile: rate "0x10": want a positive number per second, at Testfile:3`},
		{Input: p("rate 0x1p4"), ExpectedErr: `rate "0x1p4"`},
		{Input: p("rate 0"), ExpectedErr: `peer_rate_limit: profile: rate "0": want a positive number per second`},
		{Input: p("rate -5"), ExpectedErr: `rate "-5"`},
		{Input: p("rate Inf"), ExpectedErr: `rate "Inf"`},
		{Input: p("rate NaN"), ExpectedErr: `rate "NaN"`},
		{Input: p("rate 10/m"), ExpectedErr: `rate "10/m"`},
		{Input: p("rate 10 5x"), ExpectedErr: `peer_rate_limit: profile: rate: burst "5x": want a whole number of at least 1, at Testfile:3`},
		{Input: p("rate 10 0x10"), ExpectedErr: `burst "0x10"`},
		{Input: p("rate 10 0"), ExpectedErr: `burst "0"`},
		{Input: p("rate 10\nmax_peers 3x"), ExpectedErr: `peer_rate_limit: profile: max_peers "3x": want a whole number of at least 1, at Testfile:4`},
		{Input: p("rate 10\nmax_peers 0x10"), ExpectedErr: `max_peers "0x10"`},
		{Input: p("rate 10\nmax_peers 1_000"), ExpectedErr: `max_peers "1_000"`},
		{Input: p("rate 10\nmax_peers 0"), ExpectedErr: `max_peers "0"`},
		{Input: p("rate 10\naction reject 429x"), ExpectedErr: `peer_rate_limit: profile: action: reject status "429x": want 0 (the default) or a whole number from 400 to 599, at Testfile:4`},
		{Input: p("rate 10\naction reject 0x1ad"), ExpectedErr: `reject status "0x1ad"`},
		{Input: p("rate 10\naction reject 200"), ExpectedErr: `reject status "200"`},
		{Input: p("rate 10\naction reject -1"), ExpectedErr: `reject status "-1"`},
		{Input: p("rate 10\naction reject 600"), ExpectedErr: `reject status "600"`},
		{Input: p("rate 10\naction bounce"), ExpectedErr: `peer_rate_limit: profile: action "bounce": want reject [<status> [<message>]] or drop, at Testfile:4`},
		{Input: p("rate 10\naction drop 429"), ExpectedErr: `action "drop 429"`},
		{Input: p("message m {\nrate 5x\n}"), ExpectedErr: `peer_rate_limit: profile: message: rate "5x": want a positive number per second, at Testfile:4`},
		{Input: dyn("interval 5"), ExpectedErr: `peer_rate_limit: dynamic: interval "5": want a positive duration, such as 250ms, 30s or 1d, at Testfile:3`},
		{Input: dyn("interval 0s"), ExpectedErr: `interval "0s"`},
		{Input: dyn("reversal_hold 30sx"), ExpectedErr: `reversal_hold "30sx"`},
		{Input: dyn("threshold 55x 30"), ExpectedErr: `peer_rate_limit: dynamic: threshold "55x": want a decimal number from 0 to 100, at Testfile:3`},
		{Input: dyn("threshold 0x37 30"), ExpectedErr: `threshold "0x37"`},
		{Input: dyn("threshold 155 30"), ExpectedErr: `threshold "155"`},
		{Input: dyn("threshold 55 3x"), ExpectedErr: `peer_rate_limit: dynamic: threshold: 55: throttle "3x": want a whole number from 0 to 100, at Testfile:3`},
		{Input: dyn("threshold 55 0x10"), ExpectedErr: `throttle "0x10"`},
		{Input: dyn("threshold 55 130"), ExpectedErr: `throttle "130"`},
		{Input: dyn("reversal 4x"), ExpectedErr: `peer_rate_limit: dynamic: reversal "4x": want a decimal number from 0 to 100`},
		{Input: dyn("reversal_step 2x"), ExpectedErr: `peer_rate_limit: dynamic: reversal_step "2x": want a whole number from 1 to 100`},
		{Input: dyn("reversal_step 0"), ExpectedErr: `reversal_step "0"`},
		{Input: dyn("source snmp"), ExpectedErr: `peer_rate_limit: dynamic: source "snmp": want prometheus`},
		{Input: dyn("source procstat extra"), ExpectedErr: `source "procstat extra"`},
		{Input: dyn("source file"), ExpectedErr: `source "file"`},
		{Input: dyn("source prometheus http://x cpu job"), ExpectedErr: `peer_rate_limit: dynamic: source: label "job": want name=value`},
		{Input: dyn("source prometheus http://x cpu job=a job=b"), ExpectedErr: `source: label job given twice`},

		// Extra and missing arguments, blocks after options that take none.
		{Input: "peer_rate_limit edge", ExpectedErr: "peer_rate_limit: want no arguments, got 1: edge, at Testfile:1"},
		{Input: "peer_rate_limit {\nname a b\n}", ExpectedErr: "peer_rate_limit: name: want 1 argument, got 2: a b, at Testfile:2"},
		{Input: "peer_rate_limit {\nname\n}", ExpectedErr: "peer_rate_limit: name: want 1 argument, got none"},
		{Input: "peer_rate_limit {\nname a {\nb\n}\n}", ExpectedErr: "peer_rate_limit: name takes no block, at Testfile:2"},
		{Input: "peer_rate_limit {\nprofile {\nrate 1\n}\n}", ExpectedErr: "peer_rate_limit: profile: want 1 argument, got none, at Testfile:2"},
		{Input: "peer_rate_limit {\nprofile a b {\nrate 1\n}\n}", ExpectedErr: "peer_rate_limit: profile: want 1 argument, got 2: a b"},
		{Input: "peer_rate_limit {\ndynamic procstat\n}", ExpectedErr: "peer_rate_limit: dynamic: want no arguments, got 1: procstat"},
		{Input: p("peer {a} {b}"), ExpectedErr: "peer_rate_limit: profile: peer: want 1 argument, got 2: {a} {b}, at Testfile:3"},
		{Input: p("peer"), ExpectedErr: "peer_rate_limit: profile: peer: want 1 argument, got none"},
		{Input: p("missing_peer refuse now"), ExpectedErr: "peer_rate_limit: profile: missing_peer: want 1 argument, got 2"},
		{Input: p("select {http.request.header.X-Peer}"), ExpectedErr: "peer_rate_limit: profile: select: want at least 2 arguments, got 1"},
		{Input: p("peer_cidr"), ExpectedErr: "peer_rate_limit: profile: peer_cidr: want at least 1 argument, got none"},
		{Input: p("rate"), ExpectedErr: "peer_rate_limit: profile: rate: want 1 to 2 arguments, got none"},
		{Input: p("rate 10 5 7"), ExpectedErr: "peer_rate_limit: profile: rate: want 1 to 2 arguments, got 3: 10 5 7, at Testfile:3"},
		{Input: p("rate 10 {\nburst 5\n}"), ExpectedErr: "peer_rate_limit: profile: rate takes no block, at Testfile:3"},
		{Input: p("rate 10\naction"), ExpectedErr: "peer_rate_limit: profile: action: want 1 to 3 arguments, got none"},
		{Input: p("rate 10\naction reject 429 slow extra"), ExpectedErr: "peer_rate_limit: profile: action: want 1 to 3 arguments, got 4"},
		{Input: p("rate 10\ndynamic true"), ExpectedErr: "peer_rate_limit: profile: dynamic: want no arguments, got 1: true"},
		{Input: p("rate 10\nmax_peers 5 6"), ExpectedErr: "peer_rate_limit: profile: max_peers: want 1 argument, got 2"},
		{Input: p("message {\nrate 1\n}"), ExpectedErr: "peer_rate_limit: profile: message: want 1 argument, got none"},
		{Input: p("message a b {\nrate 1\n}"), ExpectedErr: "peer_rate_limit: profile: message: want 1 argument, got 2: a b"},
		{Input: p("message m {\nrate 5 1 2\n}"), ExpectedErr: "peer_rate_limit: profile: message: rate: want 1 to 2 arguments, got 3"},
		{Input: p("message m {\nrate 5\ndynamic yes\n}"), ExpectedErr: "peer_rate_limit: profile: message: dynamic: want no arguments, got 1: yes"},
		{Input: dyn("interval 1s 2s"), ExpectedErr: "peer_rate_limit: dynamic: interval: want 1 argument, got 2: 1s 2s"},
		{Input: dyn("threshold 55"), ExpectedErr: "peer_rate_limit: dynamic: threshold: want 2 arguments, got 1: 55"},
		{Input: dyn("threshold 55 30 10"), ExpectedErr: "peer_rate_limit: dynamic: threshold: want 2 arguments, got 3"},
		{Input: dyn("reversal"), ExpectedErr: "peer_rate_limit: dynamic: reversal: want 1 argument, got none"},
		{Input: dyn("reversal_step 5 5"), ExpectedErr: "peer_rate_limit: dynamic: reversal_step: want 1 argument, got 2"},
		{Input: dyn("source"), ExpectedErr: "peer_rate_limit: dynamic: source: want at least 1 argument, got none"},

		// Repeats: profile (once per name), peer_cidr, message (once per
		// type) and threshold add up; every other option is given once.
		{Input: "peer_rate_limit {\nname a\nname b\n}", ExpectedErr: "peer_rate_limit: name given twice (first at Testfile:2), at Testfile:3"},
		{Input: "peer_rate_limit {\nprofile p {\nrate 1\n}\nprofile q {\nrate 2\n}\nprofile p {\nrate 3\n}\n}",
			ExpectedErr: "peer_rate_limit: profile p given twice (first at Testfile:2), at Testfile:8"},
		{Input: "peer_rate_limit {\ndynamic {\nsource procstat\n}\ndynamic {\nsource procstat\n}\n}", ExpectedErr: "peer_rate_limit: dynamic given twice (first at Testfile:2), at Testfile:5"},
		{Input: p("rate 10\nrate 20"), ExpectedErr: "peer_rate_limit: profile: rate given twice (first at Testfile:3), at Testfile:4"},
		{Input: p("peer {a}\npeer {b}\nrate 1"), ExpectedErr: "peer_rate_limit: profile: peer given twice"},
		{Input: p("missing_peer refuse\nmissing_peer fallback"), ExpectedErr: "peer_rate_limit: profile: missing_peer given twice"},
		{Input: p("select {a} x\nselect {a} y"), ExpectedErr: "peer_rate_limit: profile: select given twice"},
		{Input: p("rate 10\naction drop\naction reject"), ExpectedErr: "peer_rate_limit: profile: action given twice (first at Testfile:4), at Testfile:5"},
		{Input: p("rate 10\ndynamic\ndynamic"), ExpectedErr: "peer_rate_limit: profile: dynamic given twice"},
		{Input: p("rate 10\nmax_peers 5\nmax_peers 6"), ExpectedErr: "peer_rate_limit: profile: max_peers given twice"},
		{Input: p("message m {\nrate 1\n}\nmessage n {\nrate 1\n}\nmessage m {\nrate 2\n}"),
			ExpectedErr: "peer_rate_limit: profile: message m given twice (first at Testfile:3), at Testfile:9"},
		{Input: p("message m {\nrate 1\nrate 2\n}"), ExpectedErr: "peer_rate_limit: profile: message: rate given twice (first at Testfile:4), at Testfile:5"},
		{Input: p("message m {\nrate 1\ndynamic\ndynamic\n}"), ExpectedErr: "peer_rate_limit: profile: message: dynamic given twice"},
		{Input: p("message m {\nmatch {\npath /a\n}\nmatch {\npath /b\n}\nrate 1\n}"), ExpectedErr: "peer_rate_limit: profile: message: match given twice (first at Testfile:4), at Testfile:7"},
		{Input: dyn("source procstat\nsource file /x"), ExpectedErr: "peer_rate_limit: dynamic: source given twice (first at Testfile:3), at Testfile:4"},
		{Input: dyn("interval 1s\ninterval 2s"), ExpectedErr: "peer_rate_limit: dynamic: interval given twice"},
		{Input: dyn("reversal 10\nreversal 20"), ExpectedErr: "peer_rate_limit: dynamic: reversal given twice"},
		{Input: dyn("reversal_hold 1s\nreversal_hold 2s"), ExpectedErr: "peer_rate_limit: dynamic: reversal_hold given twice"},
		{Input: dyn("reversal_step 5\nreversal_step 6"), ExpectedErr: "peer_rate_limit: dynamic: reversal_step given twice"},

		{Input: "peer_rate_limit {\ncolour blue\n}", ExpectedErr: `peer_rate_limit: unknown option "colour", at Testfile:2`},
		{Input: "peer_rate_limit {\ndiameter {\norigin_host a\n}\n}", ExpectedErr: `peer_rate_limit: unknown option "diameter", at Testfile:2`},
		{Input: p("rate 10\ncolour blue"), ExpectedErr: `peer_rate_limit: profile: unknown option "colour", at Testfile:4`},
		{Input: p("message m {\nrate 1\ncolour blue\n}"), ExpectedErr: `peer_rate_limit: profile: message: unknown option "colour", at Testfile:5`},
		{Input: dyn("colour blue"), ExpectedErr: `peer_rate_limit: dynamic: unknown option "colour", at Testfile:3`},

		{Input: p("rate 100\ncluster redis main"), Expected: `{"profiles":[{"name":"p","rate":100,"cluster":{"redis":"main"}}]}`},
		{Input: p("rate 100\ncluster redis main {\nsync 100ms\nreplica_ttl 2s\n}"),
			Expected: `{"profiles":[{"name":"p","rate":100,"cluster":{"redis":"main","sync":100000000,"replica_ttl":2000000000}}]}`},
		{Input: p("rate 100\ncluster etcd main"), ExpectedErr: `peer_rate_limit: profile: cluster "etcd": want redis <store name>, at Testfile:4`},
		{Input: p("rate 100\ncluster redis"), ExpectedErr: `peer_rate_limit: profile: cluster: want 2 arguments, got 1: redis`},
		{Input: p("rate 100\ncluster redis a\ncluster redis b"), ExpectedErr: `peer_rate_limit: profile: cluster given twice (first at Testfile:4), at Testfile:5`},
		{Input: p("rate 100\ncluster redis a {\nsync 5\n}"), ExpectedErr: `sync "5"`},
		{Input: p("rate 100\ncluster redis a {\nsync 1s\nsync 2s\n}"), ExpectedErr: `peer_rate_limit: profile: cluster: sync given twice`},
		{Input: p("rate 100\ncluster redis main {\nreplicas 3\n}"),
			Expected: `{"profiles":[{"name":"p","rate":100,"cluster":{"redis":"main","replicas":3}}]}`},
		{Input: p("rate 100\ncluster redis a {\nreplicas 0\n}"), ExpectedErr: `replicas "0"`},
		{Input: p("rate 100\ncluster redis a {\ncolour blue\n}"), ExpectedErr: `peer_rate_limit: profile: cluster: unknown option "colour", at Testfile:5`},
	}
	cfparsetest.Check(t, func() *HTTPHandler { return new(HTTPHandler) }, tests, nil)
}

func TestUnmarshalCaddyfileLayer4(t *testing.T) {
	diam := func(body string) string {
		return "peer_rate_limit {\ndiameter {\n" + body + "\n}\nprofile p {\nrate 10\n}\n}"
	}
	tests := []cfparsetest.Case{
		{Input: `peer_rate_limit {
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
		}`, Expected: `{"name":"dra","profiles":[{"name":"pgw","peer_cidrs":["127.0.0.1"],"rate":100,"burst":10,` +
			`"messages":[{"type":"gx-ccr-i","rate":5,"dynamic":true}],"action":"reject","status":429,"message":"busy"}],` +
			`"diameter":{"origin_host":"dra.example","origin_realm":"example","result_code":3004,"error_message":"too busy",` +
			`"max_length":65536,"max_queued_refusals":16,"refusal_wait":2000000000}}`},
		{Input: "peer_rate_limit {\nprofile conns {\nrate 5\naction drop\n}\n}", Expected: `{"profiles":[{"name":"conns","rate":5,"action":"drop"}]}`},

		{Input: diam("result_code 3002x"), ExpectedErr: `peer_rate_limit: diameter: result_code "3002x": want a whole number from 0 to 4294967295, at Testfile:3`},
		{Input: diam("result_code 0xbba"), ExpectedErr: `result_code "0xbba"`},
		{Input: diam("result_code 4294967297"), ExpectedErr: `result_code "4294967297"`},
		{Input: diam("max_length 4k"), ExpectedErr: `peer_rate_limit: diameter: max_length "4k": want a whole number of at least 0`},
		{Input: diam("max_queued_refusals -1"), ExpectedErr: `max_queued_refusals "-1"`},
		{Input: diam("max_queued_refusals 0x10"), ExpectedErr: `max_queued_refusals "0x10"`},
		{Input: diam("refusal_wait 5"), ExpectedErr: `peer_rate_limit: diameter: refusal_wait "5": want a positive duration`},
		{Input: diam("refusal_wait 0s"), ExpectedErr: `refusal_wait "0s"`},
		{Input: diam("refusal_wait soon"), ExpectedErr: `refusal_wait "soon"`},

		{Input: "peer_rate_limit {\ndiameter on {\norigin_host a\n}\n}", ExpectedErr: "peer_rate_limit: diameter: want no arguments, got 1: on, at Testfile:2"},
		{Input: diam("origin_host a b"), ExpectedErr: "peer_rate_limit: diameter: origin_host: want 1 argument, got 2: a b, at Testfile:3"},
		{Input: diam("origin_realm"), ExpectedErr: "peer_rate_limit: diameter: origin_realm: want 1 argument, got none"},
		{Input: diam(`error_message too busy`), ExpectedErr: "peer_rate_limit: diameter: error_message: want 1 argument, got 2: too busy"},
		{Input: diam("result_code 3002 3004"), ExpectedErr: "peer_rate_limit: diameter: result_code: want 1 argument, got 2"},
		{Input: diam("refusal_wait 1s {\nx\n}"), ExpectedErr: "peer_rate_limit: diameter: refusal_wait takes no block, at Testfile:3"},

		{Input: "peer_rate_limit {\ndiameter {\norigin_host a\n}\ndiameter {\norigin_host b\n}\n}",
			ExpectedErr: "peer_rate_limit: diameter given twice (first at Testfile:2), at Testfile:5"},
		{Input: diam("origin_host a\norigin_host b"), ExpectedErr: "peer_rate_limit: diameter: origin_host given twice (first at Testfile:3), at Testfile:4"},
		{Input: diam("origin_realm a\norigin_realm b"), ExpectedErr: "peer_rate_limit: diameter: origin_realm given twice"},
		{Input: diam("result_code 3002\nresult_code 3004"), ExpectedErr: "peer_rate_limit: diameter: result_code given twice"},
		{Input: diam("error_message a\nerror_message b"), ExpectedErr: "peer_rate_limit: diameter: error_message given twice"},
		{Input: diam("max_length 100\nmax_length 200"), ExpectedErr: "peer_rate_limit: diameter: max_length given twice"},
		{Input: diam("max_queued_refusals 1\nmax_queued_refusals 2"), ExpectedErr: "peer_rate_limit: diameter: max_queued_refusals given twice"},
		{Input: diam("refusal_wait 1s\nrefusal_wait 2s"), ExpectedErr: "peer_rate_limit: diameter: refusal_wait given twice"},
		{Input: "peer_rate_limit {\nprofile p {\nrate 1\n}\nprofile p {\nrate 2\n}\n}", ExpectedErr: "peer_rate_limit: profile p given twice (first at Testfile:2), at Testfile:5"},
		{Input: "peer_rate_limit {\nprofile p {\nmessage gx-ccr-i {\nrate 1\n}\nmessage gx-ccr-i {\nrate 2\n}\n}\n}", ExpectedErr: "peer_rate_limit: profile: message gx-ccr-i given twice"},

		{Input: diam("colour blue"), ExpectedErr: `peer_rate_limit: diameter: unknown option "colour", at Testfile:3`},
		// Layer 4 messages have no HTTP matchers.
		{Input: "peer_rate_limit {\nprofile p {\nmessage m {\nmatch {\npath /x\n}\nrate 1\n}\n}\n}", ExpectedErr: `peer_rate_limit: profile: message: unknown option "match", at Testfile:4`},
	}
	cfparsetest.Check(t, func() *L4Handler { return new(L4Handler) }, tests, nil)
}

func TestUnmarshalCaddyfileEgress(t *testing.T) {
	g := func(body string) string { return "peer_rate_limit {\ngroup g 10.0.0.1:80 {\n" + body + "\n}\n}" }
	tests := []cfparsetest.Case{
		{Input: `peer_rate_limit {
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
		}`, Expected: `{"name":"out","groups":[{"name":"pcrf","rate":100,"messages":[{"type":"ccr","match":{"path":["/ccr"]},"rate":10,"burst":2}],` +
			`"action":"reject","status":503,"max_peers":10,"upstreams":["10.0.0.1:80","10.0.0.2:80"]},` +
			`{"name":"ocs","rate":5,"action":"drop","upstreams":["10.0.0.3:80"]}],"transport":{"dial_timeout":2000000000,"protocol":"http"}}`},

		{Input: "peer_rate_limit extra", ExpectedErr: "peer_rate_limit: transport: want no arguments, got 1: extra, at Testfile:1"},
		{Input: "peer_rate_limit {\ngroup g {\nrate 1\n}\n}", ExpectedErr: "peer_rate_limit: transport: group: want at least 2 arguments, got 1: g, at Testfile:2"},
		{Input: "peer_rate_limit {\nname a b\n}", ExpectedErr: "peer_rate_limit: transport: name: want 1 argument, got 2: a b"},
		{Input: "peer_rate_limit {\ntransport\n}", ExpectedErr: "peer_rate_limit: transport: transport: want 1 argument, got none"},
		{Input: "peer_rate_limit {\ntransport http h2c\n}", ExpectedErr: "peer_rate_limit: transport: transport: want 1 argument, got 2: http h2c"},
		{Input: g("rate 3x"), ExpectedErr: `peer_rate_limit: transport: group: rate "3x": want a positive number per second, at Testfile:3`},
		{Input: g("rate 10\nmax_peers 0x10"), ExpectedErr: `peer_rate_limit: transport: group: max_peers "0x10"`},
		{Input: g("rate 10 5 5"), ExpectedErr: "peer_rate_limit: transport: group: rate: want 1 to 2 arguments, got 3"},

		{Input: "peer_rate_limit {\nname a\nname b\n}", ExpectedErr: "peer_rate_limit: transport: name given twice (first at Testfile:2), at Testfile:3"},
		{Input: "peer_rate_limit {\ngroup g 10.0.0.1:80 {\nrate 1\n}\ngroup g 10.0.0.2:80 {\nrate 1\n}\n}", ExpectedErr: "peer_rate_limit: transport: group g given twice (first at Testfile:2), at Testfile:5"},
		{Input: "peer_rate_limit {\ntransport http\ntransport http\n}", ExpectedErr: "peer_rate_limit: transport: transport given twice (first at Testfile:2), at Testfile:3"},
		{Input: "peer_rate_limit {\ndynamic {\nsource procstat\n}\ndynamic {\nsource procstat\n}\n}", ExpectedErr: "peer_rate_limit: transport: dynamic given twice"},
		{Input: g("rate 1\nrate 2"), ExpectedErr: "peer_rate_limit: transport: group: rate given twice (first at Testfile:3), at Testfile:4"},
		{Input: g("message m {\nrate 1\n}\nmessage m {\nrate 1\n}"), ExpectedErr: "peer_rate_limit: transport: group: message m given twice"},

		{Input: "peer_rate_limit {\ncolour blue\n}", ExpectedErr: `peer_rate_limit: transport: unknown option "colour", at Testfile:2`},
		{Input: "peer_rate_limit {\ntransport nosuch\n}", ExpectedErr: `nosuch`},
	}
	cfparsetest.Check(t, func() *EgressTransport { return new(EgressTransport) }, tests, nil)
}
