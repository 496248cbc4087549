package tenantroute_test

import (
	"testing"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Each bind on a routed connection decides whether it counts (README, "Only
// authenticated load counts"): a successful bind counts it on its node and
// its tenant, a failed one stops that, a successful one after it counts it
// again, and a successful bind after a successful one changes nothing. The
// router judges each BindResponse before the client has it, so the admin
// view is read as soon as each Bind returns.
func TestBindOutcomesOnOneConnection(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 1, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", ldapRouter(front, addrs, "partitions 1\n\t\t\t\t\tmax_failed_binds 5"))
	c.WaitTCP(t, front)
	conn, err := ldap.DialURL("ldap://" + front)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	steps := []struct {
		password      string
		counted       bool
		unauth, fails int64
	}{
		{"pw-acme", true, 0, 0},
		{"pw-acme", true, 0, 0}, // the same user again: nothing changes
		{"wrong", false, 1, 1},
		{"wrong", false, 1, 2},
		{"pw-acme", true, 0, 2},
		{"pw-acme", true, 0, 2},
		{"wrong", false, 1, 3},
		{"pw-acme", true, 0, 3},
	}
	for i, s := range steps {
		err := conn.Bind("uid=alice,o=acme,dc=example", s.password)
		if s.counted != (err == nil) {
			t.Fatalf("bind %d with %q: %v", i+1, s.password, err)
		}
		v := adminView(t, c)
		want := int64(0)
		if s.counted {
			want = 1
		}
		if v.OpenConnections[addrs[0]] != want || int64(v.Tenants["acme"].AuthenticatedConnections) != want ||
			v.UnauthenticatedConnections != s.unauth || int64(v.FailedBinds["acme"]) != s.fails {
			t.Fatalf("after bind %d with %q: node count %d, acme authenticated %d, unauthenticated %d, failed binds %d; want %d %d %d %d",
				i+1, s.password, v.OpenConnections[addrs[0]], v.Tenants["acme"].AuthenticatedConnections,
				v.UnauthenticatedConnections, v.FailedBinds["acme"], want, want, s.unauth, s.fails)
		}
	}
}
