package portrange_test

import (
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	"github.com/edgesteer/edgesteer/caddymodules/portrange"
)

func TestMatcherUnmarshalCaddyfile(t *testing.T) {
	cfparsetest.Check(t, func() *portrange.MatchPortRange { return new(portrange.MatchPortRange) }, []cfparsetest.Case{
		{Input: "port_range 3000", Expected: `{"ports":["3000"]}`},
		{Input: "port_range local 1024-2047 3000", Expected: `{"side":"local","ports":["1024-2047","3000"]}`},
		{Input: "port_range remote 1-2 {\nports 3-4 5\nports 6\n}", Expected: `{"side":"remote","ports":["1-2","3-4","5","6"]}`},
		{Input: "port_range {\nside local\ntier_map tiers.json\nnode l2b\n}", Expected: `{"side":"local","tier_map_file":"tiers.json","node":"l2b"}`},

		{Input: "port_range {\nside local remote\n}", ExpectedErr: "port_range matcher: side: want 1 argument, got 2: local remote, at Testfile:2"},
		{Input: "port_range {\nside local\nside remote\n}", ExpectedErr: "port_range matcher: side given twice (first at Testfile:2), at Testfile:3"},
		{Input: "port_range local {\nside remote\n}", ExpectedErr: "port_range matcher: side: given twice (first on the matcher's line), at Testfile:2"},
		{Input: "port_range {\nnode a\nnode b\n}", ExpectedErr: "port_range matcher: node given twice (first at Testfile:2), at Testfile:3"},
		{Input: "port_range {\nnode a b\n}", ExpectedErr: "port_range matcher: node: want 1 argument, got 2: a b, at Testfile:2"},
		{Input: "port_range {\ntier_map a.json\ntier_map b.json\n}", ExpectedErr: "port_range matcher: tier_map given twice"},
		{Input: "port_range {\ntier_map\n}", ExpectedErr: "port_range matcher: tier_map: want 1 argument, got none, at Testfile:2"},
		{Input: "port_range {\nports\n}", ExpectedErr: "port_range matcher: ports: want at least 1 argument, got none"},
		{Input: "port_range {\ncolour blue\n}", ExpectedErr: `port_range matcher: unknown option "colour", at Testfile:2`},
	}, nil)
}

func TestTransportUnmarshalCaddyfile(t *testing.T) {
	cfparsetest.Check(t, func() *portrange.Transport { return new(portrange.Transport) }, []cfparsetest.Case{
		{Input: "port_range", Expected: `{}`},
		{Input: "port_range {\nports 20000-29999\nlocal_ip 127.0.0.1\nusip\nhttp {\nkeepalive 90s\n}\n}",
			Expected: `{"ports":"20000-29999","local_ip":"127.0.0.1","usip":true,"http":{"keep_alive":{"idle_timeout":90000000000}}}`},
		{Input: "port_range {\ntier_map t.json\nnode l2a\n}", Expected: `{"tier_map_file":"t.json","node":"l2a"}`},

		{Input: "port_range 2000-3000", ExpectedErr: "port_range transport: want no arguments, got 1: 2000-3000, at Testfile:1"},
		{Input: "port_range {\nports 2000-3000 4000-5000\n}", ExpectedErr: "port_range transport: ports: want 1 argument, got 2: 2000-3000 4000-5000, at Testfile:2"},
		{Input: "port_range {\nports 2000-3000\nports 4000-5000\n}", ExpectedErr: "port_range transport: ports given twice (first at Testfile:2), at Testfile:3"},
		{Input: "port_range {\nlocal_ip 127.0.0.1 127.0.0.2\n}", ExpectedErr: "port_range transport: local_ip: want 1 argument, got 2"},
		{Input: "port_range {\nusip on\n}", ExpectedErr: "port_range transport: usip: want no arguments, got 1: on, at Testfile:2"},
		{Input: "port_range {\nusip\nusip\n}", ExpectedErr: "port_range transport: usip given twice"},
		{Input: "port_range {\nhttp h2 {\nkeepalive 90s\n}\n}", ExpectedErr: "port_range transport: http: want no arguments, got 1: h2, at Testfile:2"},
		{Input: "port_range {\nhttp {\n}\nhttp {\n}\n}", ExpectedErr: "port_range transport: http given twice (first at Testfile:2), at Testfile:4"},
		{Input: "port_range {\nnode a\nnode a\n}", ExpectedErr: "port_range transport: node given twice"},
		{Input: "port_range {\ncolour blue\n}", ExpectedErr: `port_range transport: unknown option "colour", at Testfile:2`},
	}, nil)
}
