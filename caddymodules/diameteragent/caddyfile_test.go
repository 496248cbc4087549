package diameteragent

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

const full = `diameter_agent dra {
	origin_host dra.example.net
	origin_realm example.net
	host_ip_address 127.0.0.1
	vendor_id 10415
	application 16777238 vendor 10415
	application 4
	peer pcrf1.example.net {
		realm example.net
		address 127.0.0.1:3871
	}
	peer ocs1.example.net {
		realm example.net
		address 127.0.0.1:3872
	}
	group pcrf {
		peers pcrf1.example.net
		policy least_outstanding
		request_timeout 2s
		max_pending 100
		max_pending_per_peer 50
		egress {
			rate 500
			message gx-ccr-i 100 10
			result_code 3004
			error_message "PCRF group busy"
		}
	}
	group ocs {
		peers ocs1.example.net
	}
	route example.net pcrf 16777238
	route example.net ocs 4
	default_group pcrf
	ingress {
		message gx-ccr-i 50
		action drop
	}
	watchdog 10s
	reconnect 500ms 5s
	max_bindings 1000
	binding_ttl 10m
	server_request_timeout 2s
	max_length 4096
}`

const fullJSON = `{"name":"dra","origin_host":"dra.example.net","origin_realm":"example.net","host_ip_addresses":["127.0.0.1"],"vendor_id":10415,` +
	`"applications":[{"id":16777238,"vendor_id":10415},{"id":4}],` +
	`"peers":[{"host":"pcrf1.example.net","realm":"example.net","address":"127.0.0.1:3871"},{"host":"ocs1.example.net","realm":"example.net","address":"127.0.0.1:3872"}],` +
	`"groups":[{"name":"pcrf","peers":["pcrf1.example.net"],"policy":"least_outstanding","request_timeout":2000000000,"max_pending":100,"max_pending_per_peer":50,` +
	`"egress":{"rate":500,"messages":[{"type":"gx-ccr-i","rate":100,"burst":10}],"result_code":3004,"error_message":"PCRF group busy"}},` +
	`{"name":"ocs","peers":["ocs1.example.net"]}],` +
	`"routes":[{"realm":"example.net","applications":[16777238],"group":"pcrf"},{"realm":"example.net","applications":[4],"group":"ocs"}],` +
	`"default_group":"pcrf","ingress":{"messages":[{"type":"gx-ccr-i","rate":50}],"action":"drop"},` +
	`"watchdog":10000000000,"reconnect_min":500000000,"reconnect_max":5000000000,"max_bindings":1000,"binding_ttl":600000000000,` +
	`"server_request_timeout":2000000000,"max_length":4096}`

// minimal is a valid agent; cases append one option to it.
const minimal = "diameter_agent {\norigin_host dra\norigin_realm r\nhost_ip_address 127.0.0.1\napplication 4\n"

func TestUnmarshalCaddyfile(t *testing.T) {
	cases := []cfparsetest.Case{
		{Input: full, Expected: fullJSON},
		{Input: minimal + "}", Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}]}`},
		{Input: minimal + "application 4 acct\n}", Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4},{"id":4,"acct":true}]}`},
		{Input: minimal + "peer p {\nrealm r\naddress 127.0.0.1:1\napplications 4 16777238\n}\n}",
			Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}],"peers":[{"host":"p","realm":"r","address":"127.0.0.1:1","applications":[4,16777238]}]}`},
		{Input: minimal + "peer p {\napplications 4\napplications 4\n}\n}", ExpectedErr: "diameter_agent: peer: applications given twice"},
		{Input: minimal + "group g {\ndynamic {\nsource file /run/load\ninterval 1s\nthreshold 60 40\nreversal 50\nreversal_hold 10s\nreversal_step 20\n}\n}\n}",
			Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}],"groups":[{"name":"g","peers":null,"dynamic":{"source":"file","path":"/run/load","interval":1000000000,"thresholds":[{"load":60,"throttle":40}],"reversal":50,"reversal_hold":10000000000,"reversal_step":20}}]}`},
		{Input: minimal + "group g {\ndynamic {\nsource nope\n}\n}\n}", ExpectedErr: `diameter_agent: group: dynamic: source "nope"`},
		{Input: minimal + "origin_host x\n}", ExpectedErr: "diameter_agent: origin_host given twice"},
		{Input: minimal + "bogus 1\n}", ExpectedErr: `diameter_agent: unknown option "bogus"`},
		{Input: minimal + "application 4 vendor\n}", ExpectedErr: `diameter_agent: application "vendor": want vendor <id> or acct`},
		{Input: minimal + "application x\n}", ExpectedErr: `diameter_agent: application "x"`},
		{Input: minimal + "watchdog 10x\n}", ExpectedErr: `diameter_agent: watchdog "10x"`},
		{Input: minimal + "max_length 10\n}", ExpectedErr: `diameter_agent: max_length "10"`},
		{Input: minimal + "peer p {\nrealm r\nport 1\n}\n}", ExpectedErr: `diameter_agent: peer: unknown option "port"`},
		{Input: minimal + "peer p {\nrealm r\n}\npeer p {\nrealm r\n}\n}", ExpectedErr: "diameter_agent: peer p given twice"},
		{Input: minimal + "group g {\npolicy random\nfoo\n}\n}", ExpectedErr: `diameter_agent: group: unknown option "foo"`},
		{Input: minimal + "group g {\negress {\nrate 0\n}\n}\n}", ExpectedErr: `diameter_agent: group: egress: rate "0"`},
		{Input: minimal + "group g {\negress {\naction refuse\n}\n}\n}", ExpectedErr: `diameter_agent: group: egress: action "refuse": want reject or drop`},
		{Input: minimal + "group g {\negress {\nresult_code 200\n}\n}\n}", ExpectedErr: `diameter_agent: group: egress: result_code "200"`},
		{Input: minimal + "group g {\negress {\nmessage gx-ccr-i 5\nmessage gx-ccr-i 6\n}\n}\n}", ExpectedErr: "message gx-ccr-i given twice"},
		{Input: minimal + "route r\n}", ExpectedErr: "diameter_agent: route: want at least 2 arguments, got 1: r"},
		{Input: minimal + "route r g app\n}", ExpectedErr: `diameter_agent: route "app"`},
		{Input: minimal + "reconnect 1s\n}", ExpectedErr: "diameter_agent: reconnect: want 2 arguments, got 1"},
		{Input: "diameter_agent a b {\n}", ExpectedErr: "diameter_agent: want 0 to 1 arguments, got 2"},
		{Input: minimal + "doic {\nreport_realm\nvalidity 20s\nmax_reports 500\naction drop\nresult_code 3004\nerror_message busy\n}\n}",
			Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}],"doic":{"report_realm":true,"validity":20000000000,"max_reports":500,"action":"drop","result_code":3004,"error_message":"busy"}}`},
		{Input: minimal + "doic\n}", Expected: `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}],"doic":{}}`},
		{Input: minimal + "doic {\nvalidity 10ms\n}\n}", ExpectedErr: `diameter_agent: doic: validity "10ms"`},
		{Input: minimal + "doic {\naction refuse\n}\n}", ExpectedErr: `diameter_agent: doic: action "refuse": want reject or drop`},
		{Input: minimal + "doic {\nsequence 1\n}\n}", ExpectedErr: `diameter_agent: doic: unknown option "sequence"`},
		{Input: minimal + "doic\ndoic\n}", ExpectedErr: `diameter_agent: doic given twice`},
	}
	cfparsetest.Check(t, func() *Handler { return new(Handler) }, cases, nil)
}

// TestValidate: what parses but cannot be an agent fails at load, naming
// the option and the value.
func TestValidate(t *testing.T) {
	cases := []struct{ extra, err string }{
		{"", ""},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\npolicy random\n}", `group g: policy "random": want round_robin, least_outstanding, latency_bucket or least_loaded`},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\npolicy least_loaded\n}\ndoic {\nvalidity 30s\n}", ""},
		{"doic {\nvalidity 25h\n}", "doic: validity 25h0m0s: want 1s to 24h"},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers q\n}", `group g: peer "q" is not in the peer table`},
		{"peer p {\nrealm r\naddress nowhere\n}", `peer p: address "nowhere": want host:port`},
		{"route r nosuch", `route 0: realm "r", group "nosuch"`},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\npolicy latency_bucket\nbucket_width 16ms\n}", ""},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\negress {\nrate 10\n}\ndynamic {\nsource file /run/load\nthreshold 50 20\n}\n}", ""},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\ndynamic {\nsource procstat\nthreshold 50 20\n}\n}", "group g: dynamic: no egress limit to throttle"},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\n}\ngroup g {\npeers p\negress {\nrate 10\n}\ndynamic {\nsource procstat\nthreshold 50 20\nthreshold 40 30\n}\n}", "group g: dynamic: threshold table not monotonic"},
		{"peer p {\nrealm r\naddress 127.0.0.1:1\napplications 5\n}", "peer p: application 5: not among the agent's applications"},
		{"default_group nosuch", `default_group "nosuch": no such group`},
		{"watchdog 2s", "watchdog 2s: at least 6s"},
		{"ingress {\nmax_peers 3\n}", "diameter_agent: ingress: no rate and no message limit given"},
	}
	for _, c := range cases {
		h := new(Handler)
		in := minimal + c.extra + "\n}"
		if err := h.UnmarshalCaddyfile(caddyfileDispenser(in)); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		err := h.validate()
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.extra, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: want an error containing %q, got %v", c.extra, c.err, err)
		}
	}
	h := &Handler{OriginHost: "dra", OriginRealm: "r", HostIPAddresses: []string{"localhost"}}
	if err := h.validate(); err == nil || !strings.Contains(err.Error(), `host_ip_address "localhost": not an IP address`) {
		t.Errorf("host_ip_address localhost: %v", err)
	}
	h.HostIPAddresses = nil
	if err := h.validate(); err == nil || !strings.Contains(err.Error(), "host_ip_address: none given") {
		t.Errorf("no host_ip_address: %v", err)
	}
}

func caddyfileDispenser(s string) *caddyfile.Dispenser { return caddyfile.NewTestDispenser(s) }
