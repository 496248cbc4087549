package tenantroute_test

import (
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	"github.com/edgesteer/edgesteer/caddymodules/tenantroute"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []cfparsetest.Case{
		{Input: "tenant_route", Expected: `{}`},
		{Input: `tenant_route {
			name ldap
			nodes 127.0.0.1:3891 127.0.0.1:3892
			nodes 127.0.0.1:3893
			partitions 2
			tenant_partitions bigcorp 3
			tenant_partitions smallcorp 1
			tenant_rdn o
			tenant_regexp ",o=([^,]+),"
			tenant {l4.tls.server_name}
			dial_timeout 3s
			cool_off 1d
			first_response_timeout 500ms
			max_message_length 65536
			etcd http://127.0.0.1:2379 http://127.0.0.1:2380 {
				prefix /ldap/nodes/
				assignment_prefix /ldap/assign/
			}
		}`, Expected: `{"name":"ldap","nodes":["127.0.0.1:3891","127.0.0.1:3892","127.0.0.1:3893"],` +
			`"etcd":{"endpoints":["http://127.0.0.1:2379","http://127.0.0.1:2380"],"prefix":"/ldap/nodes/","assignment_prefix":"/ldap/assign/"},` +
			`"partitions":2,"tenant_partitions":{"bigcorp":3,"smallcorp":1},` +
			`"tenant_rdn":"o","tenant_regexp":",o=([^,]+),","tenant":"{l4.tls.server_name}",` +
			`"dial_timeout":3000000000,"cool_off":86400000000000,"first_response_timeout":500000000,"max_message_length":65536}`},

		{Input: `tenant_route {
			nodes 127.0.0.1:3891
			auto_partitions {
				target_per_node 50
				max 4
				cool_down 2m
			}
			max_per_node 500
			max_failed_binds 2
		}`, Expected: `{"nodes":["127.0.0.1:3891"],"auto_partitions":{"target_per_node":50,"max":4,"cool_down":120000000000},"max_per_node":500,"max_failed_binds":2}`},
		{Input: `tenant_route {
			auto_partitions {
				share_factor 2.5
				target_requests_per_node 150.5
				cool_down 30s
			}
		}`, Expected: `{"auto_partitions":{"share_factor":2.5,"target_requests_per_node":150.5,"cool_down":30000000000}}`},
		{Input: "tenant_route {\npartitions_by_size 0:1 1000:2 10000:4\ntenant_sizes_file /etc/sizes\n}",
			Expected: `{"partitions_by_size":[{"min_size":0,"partitions":1},{"min_size":1000,"partitions":2},{"min_size":10000,"partitions":4}],"tenant_sizes_file":"/etc/sizes"}`},
		{Input: "tenant_route {\npartitions_by_size 0:2 1000:1\n}", ExpectedErr: `partitions_by_size 0:2 1000:1: step 1000:1 after 0:2: sizes must increase and partitions must not decrease, at Testfile:2`},
		{Input: "tenant_route {\npartitions_by_size 0:1 1k:2\n}", ExpectedErr: `partitions_by_size 0:1 1k:2: step "1k:2": want size:partitions`},
		{Input: "tenant_route {\nauto_partitions {\nmax 3\n}\n}", ExpectedErr: `auto_partitions: give target_per_node, share_factor or target_requests_per_node (at least one)`},
		{Input: "tenant_route {\nauto_partitions {\nshare_factor 0.5\n}\n}", ExpectedErr: `tenant_route: auto_partitions: share_factor "0.5": want a decimal number of at least 1, at Testfile:3`},
		{Input: "tenant_route {\nauto_partitions {\nshare_factor 2x\n}\n}", ExpectedErr: `tenant_route: auto_partitions: share_factor "2x"`},
		{Input: "tenant_route {\nauto_partitions {\ntarget_requests_per_node 0\n}\n}", ExpectedErr: `tenant_route: auto_partitions: target_requests_per_node "0": want a decimal number of at least 0.001`},
		{Input: "tenant_route {\nauto_partitions {\ntarget_requests_per_node NaN\n}\n}", ExpectedErr: `target_requests_per_node "NaN"`},
		{Input: "tenant_route {\nauto_partitions {\ntarget_per_node 0\n}\n}", ExpectedErr: `tenant_route: auto_partitions: target_per_node "0": want a whole number of at least 1`},
		{Input: "tenant_route {\nauto_partitions {\ntarget_per_node 5\ncool_down 0s\n}\n}", ExpectedErr: `tenant_route: auto_partitions: cool_down "0s": want a positive duration`},
		{Input: "tenant_route {\nauto_partitions {\ntarget_per_node 5\nburst 2\n}\n}", ExpectedErr: `burst`},
		{Input: "tenant_route {\nauto_partitions 5\n}", ExpectedErr: `want no arguments, got 1: 5`},
		{Input: "tenant_route {\nmax_per_node 0\n}", ExpectedErr: `tenant_route: max_per_node "0"`},
		{Input: "tenant_route {\nmax_failed_binds many\n}", ExpectedErr: `tenant_route: max_failed_binds "many"`},

		// Loose numbers.
		{Input: "tenant_route {\npartitions 3x\n}", ExpectedErr: `tenant_route: partitions "3x": want a whole number of at least 1, at Testfile:2`},
		{Input: "tenant_route {\npartitions 0x10\n}", ExpectedErr: `tenant_route: partitions "0x10": want a whole number of at least 1, at Testfile:2`},
		{Input: "tenant_route {\npartitions -1\n}", ExpectedErr: `tenant_route: partitions "-1"`},
		{Input: "tenant_route {\npartitions 0\n}", ExpectedErr: `tenant_route: partitions "0"`},
		{Input: "tenant_route {\ntenant_partitions acme 2x\n}", ExpectedErr: `tenant_route: tenant_partitions "2x": want a whole number of at least 1, at Testfile:2`},
		{Input: "tenant_route {\ntenant_partitions acme 0\n}", ExpectedErr: `tenant_route: tenant_partitions "0"`},
		{Input: "tenant_route {\nmax_message_length 64k\n}", ExpectedErr: `tenant_route: max_message_length "64k": want a whole number of at least 1`},
		{Input: "tenant_route {\ndial_timeout 3\n}", ExpectedErr: `tenant_route: dial_timeout "3": want a positive duration`},
		{Input: "tenant_route {\ncool_off 0s\n}", ExpectedErr: `tenant_route: cool_off "0s": want a positive duration`},
		{Input: "tenant_route {\nfirst_response_timeout -1s\n}", ExpectedErr: `tenant_route: first_response_timeout "-1s": want a positive duration, such as 250ms, 30s or 1d, at Testfile:2`},

		// Extra and missing arguments.
		{Input: "tenant_route ldap", ExpectedErr: "tenant_route: want no arguments, got 1: ldap, at Testfile:1"},
		{Input: "tenant_route {\npartitions 3 4\n}", ExpectedErr: "tenant_route: partitions: want 1 argument, got 2: 3 4, at Testfile:2"},
		{Input: "tenant_route {\nname a b\n}", ExpectedErr: "tenant_route: name: want 1 argument, got 2: a b"},
		{Input: "tenant_route {\ndial_timeout 3s 5s\n}", ExpectedErr: "tenant_route: dial_timeout: want 1 argument, got 2: 3s 5s"},
		{Input: "tenant_route {\ntenant_partitions acme\n}", ExpectedErr: "tenant_route: tenant_partitions: want 2 arguments, got 1: acme, at Testfile:2"},
		{Input: "tenant_route {\ntenant_partitions acme 2 3\n}", ExpectedErr: "tenant_route: tenant_partitions: want 2 arguments, got 3: acme 2 3"},
		{Input: "tenant_route {\nnodes\n}", ExpectedErr: "tenant_route: nodes: want at least 1 argument, got none, at Testfile:2"},
		{Input: "tenant_route {\netcd {\nprefix /p/\n}\n}", ExpectedErr: "tenant_route: etcd: want at least 1 argument, got none, at Testfile:2"},
		{Input: "tenant_route {\netcd e {\nprefix /p/ /q/\n}\n}", ExpectedErr: "tenant_route: etcd: prefix: want 1 argument, got 2: /p/ /q/, at Testfile:3"},
		{Input: "tenant_route {\ncool_off 30s {\nx\n}\n}", ExpectedErr: "tenant_route: cool_off takes no block, at Testfile:2"},

		// Repeats: single options once, tenant_partitions once per tenant.
		{Input: "tenant_route {\npartitions 2\npartitions 3\n}", ExpectedErr: "tenant_route: partitions given twice (first at Testfile:2), at Testfile:3"},
		{Input: "tenant_route {\nname a\nnodes x:1\nname b\n}", ExpectedErr: "tenant_route: name given twice (first at Testfile:2), at Testfile:4"},
		{Input: "tenant_route {\ntenant_partitions acme 2\ntenant_partitions acme 3\n}", ExpectedErr: "tenant_route: tenant_partitions acme given twice (first at Testfile:2), at Testfile:3"},
		{Input: "tenant_route {\ndial_timeout 1s\ndial_timeout 1s\n}", ExpectedErr: "tenant_route: dial_timeout given twice"},
		{Input: "tenant_route {\netcd a {\nprefix /p/\n}\netcd b {\nprefix /p/\n}\n}", ExpectedErr: "tenant_route: etcd given twice (first at Testfile:2), at Testfile:5"},
		{Input: "tenant_route {\netcd a {\nprefix /p/\nprefix /q/\n}\n}", ExpectedErr: "tenant_route: etcd: prefix given twice (first at Testfile:3), at Testfile:4"},

		{Input: "tenant_route {\ncolour blue\n}", ExpectedErr: `tenant_route: unknown option "colour", at Testfile:2`},
		{Input: "tenant_route {\netcd a {\ncolour blue\n}\n}", ExpectedErr: `tenant_route: etcd: unknown option "colour", at Testfile:3`},
	}
	cfparsetest.Check(t, func() *tenantroute.TenantRoute { return new(tenantroute.TenantRoute) }, tests, nil)
}
