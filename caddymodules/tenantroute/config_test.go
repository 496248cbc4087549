package tenantroute_test

import (
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Bad config fails caddy validate, naming the option and value.
func TestBadConfigFailsValidate(t *testing.T) {
	wrap := func(body string) string {
		return "{\n\tlayer4 {\n\t\t127.0.0.1:1 {\n\t\t\troute {\n\t\t\t\ttenant_route {\n" + body +
			"\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n"
	}
	for name, tc := range map[string]struct{ cf, want string }{
		"no nodes":            {wrap("partitions 2"), "no nodes"},
		"bad node":            {wrap("nodes ldap-1"), `node "ldap-1": want host:port`},
		"partitions":          {wrap("nodes 127.0.0.1:2\npartitions 0"), `partitions "0"`},
		"tenant constant":     {wrap("nodes 127.0.0.1:2\ntenant acme"), `tenant "acme": want a placeholder`},
		"tenant and rdn":      {wrap("nodes 127.0.0.1:2\ntenant {l4.tls.server_name}\ntenant_rdn dc"), "instead of tenant_rdn"},
		"bad regexp":          {wrap("nodes 127.0.0.1:2\ntenant_regexp (o=[a-z"), "(o=[a-z"},
		"unknown option":      {wrap("nodes 127.0.0.1:2\ncolour blue"), "colour"},
		"tenant partitions 0": {wrap("nodes 127.0.0.1:2\ntenant_partitions acme 0"), `tenant_partitions "0"`},
		"first response":      {wrap("nodes 127.0.0.1:2\nfirst_response_timeout -1s"), `first_response_timeout "-1s"`},
		"hex number":          {wrap("nodes 127.0.0.1:2\npartitions 0x10"), `partitions "0x10": want a whole number of at least 1, at `},
		"repeated option":     {wrap("nodes 127.0.0.1:2\npartitions 2\npartitions 3"), "partitions given twice (first at "},
		"extra argument":      {wrap("nodes 127.0.0.1:2\ncool_off 30s 60s"), "cool_off: want 1 argument, got 2: 30s 60s, at "},
		"assignment overlaps": {wrap("etcd http://127.0.0.1:2 {\nprefix /ldap/\nassignment_prefix /ldap/assign/\n}"),
			`assignment_prefix "/ldap/assign/" overlaps prefix "/ldap/"`},
		"sizes without table": {wrap("nodes 127.0.0.1:2\ntenant_sizes_file /x"),
			`partitions_by_size [], tenant_sizes_file "/x", etcd sizes_prefix "": give the table with one source of sizes, or neither`},
		"two sources of sizes": {wrap("partitions_by_size 0:1\ntenant_sizes_file /x\netcd http://127.0.0.1:2 {\nprefix /n/\nsizes_prefix /s/\n}"),
			`tenant_sizes_file "/x" and etcd sizes_prefix "/s/": give one`},
		"sizes overlap": {wrap("partitions_by_size 0:1\netcd http://127.0.0.1:2 {\nprefix /ldap/\nsizes_prefix /ldap/sizes/\n}"),
			`etcd sizes_prefix "/ldap/sizes/" overlaps prefix "/ldap/"`},
		"sizes file missing": {wrap("nodes 127.0.0.1:2\npartitions_by_size 0:1\ntenant_sizes_file /nonexistent/sizes"),
			`tenant_sizes_file "/nonexistent/sizes": stat /nonexistent/sizes: no such file`},
	} {
		t.Run(name, func(t *testing.T) { e2e.ValidateFails(t, tc.cf, tc.want) })
	}
}
