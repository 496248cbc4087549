package tenantroute_test

import (
	"testing"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// A reconnect storm: many connections of one tenant are dialled first,
// then all their binds are sent at once, so the router picks nodes for all
// of them together. Least connections must hold for simultaneous arrivals
// (each pick reserves its node): max/mean ≤ 1.1 over the tenant's nodes,
// counted by which slapd answers and in the admin view. Several rounds,
// with k = 2 and k = 3.
func TestReconnectStormSpreads(t *testing.T) {
	addrs, names := startNodes(t, 4, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", ldapRouter(front, addrs, "partitions 2\n\t\t\t\t\ttenant_partitions globex 3"))
	c.WaitTCP(t, front)

	const n = 60
	for _, tc := range []struct {
		tenant string
		k      int
	}{{"acme", 2}, {"globex", 3}} {
		own := placement.Rank(tc.tenant, addrs)[:tc.k]
		mean := float64(n) / float64(tc.k)
		for round := 1; round <= 3; round++ {
			conns := make([]*ldap.Conn, n)
			for i := range conns {
				conn, err := ldap.DialURL("ldap://" + front)
				if err != nil {
					t.Fatal(err)
				}
				conns[i] = conn
			}
			answered := make([]string, n)
			e2e.Together(len(conns), func(i int) {
				conn := conns[i]
				if err := conn.Bind("uid=alice,o="+tc.tenant+",dc=example", "pw-"+tc.tenant); err != nil {
					t.Errorf("bind: %v", err)
					return
				}
				answered[i], _ = searchOn(conn)
			})
			if t.Failed() {
				t.FailNow()
			}
			atSlapd := map[string]int{}
			for _, node := range answered {
				atSlapd[node]++
			}
			view := adminView(t, c)
			for _, addr := range own {
				if r := float64(atSlapd[names[addr]]) / mean; r > 1.1 {
					t.Fatalf("%s k=%d round %d: slapd side %v, max/mean %.2f", tc.tenant, tc.k, round, atSlapd, r)
				}
				if r := float64(view.OpenConnections[addr]) / mean; r > 1.1 {
					t.Fatalf("%s k=%d round %d: admin view %v, max/mean %.2f", tc.tenant, tc.k, round, view.OpenConnections, r)
				}
			}
			if len(atSlapd) != tc.k {
				t.Fatalf("%s k=%d round %d: answered by %v, want its %d nodes", tc.tenant, tc.k, round, atSlapd, tc.k)
			}
			t.Logf("%s k=%d round %d: slapd side %v", tc.tenant, tc.k, round, atSlapd)
			for _, conn := range conns {
				conn.Close()
			}
			waitView(t, c, "all connections of the round closed", func(v viewT) bool {
				for _, cnt := range v.OpenConnections {
					if cnt != 0 {
						return false
					}
				}
				return true
			})
		}
	}
}
