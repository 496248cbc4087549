package tenantroute_test

import (
	"slices"
	"testing"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// Two routers with the same membership (a static list, or etcd) place every
// tenant on the same nodes: go-ldap clients binding concurrently through
// both land only on their tenant's rendezvous top k, by slapd's answer and
// by both admin views. Least connections is per router: each router's
// open_connections are exactly the connections clients made through it.
func TestTwoRoutersOneMembership(t *testing.T) {
	e2e.SkipShort(t)
	for _, membership := range []string{"static", "etcd"} {
		t.Run(membership, func(t *testing.T) { testTwoRouters(t, membership) })
	}
}

func testTwoRouters(t *testing.T, membership string) {
	addrs, names := startNodes(t, 4, ldif)
	fronts := []string{e2e.Addr(t), e2e.Addr(t)}
	routers := make([]*e2e.Caddy, 2)
	switch membership {
	case "static":
		for i, front := range fronts {
			routers[i] = e2e.StartCaddy(t, "caddyfile", routerConfig(front, addrs, 2, "3s"))
			routers[i].WaitTCP(t, front)
		}
	case "etcd":
		_, etcdURL := e2e.StartEtcd(t)
		reg := newRegistry(t, etcdURL)
		for _, a := range addrs {
			reg.join(names[a], a, 10)
		}
		for i, front := range fronts {
			routers[i] = startEtcdExample(t, front, etcdURL)
			waitMembers(t, routers[i], addrs)
		}
	}

	// Per router and tenant, perTenant connections dialled first, then all
	// binds sent at once through both routers.
	const perTenant = 15
	type held struct {
		router int
		tenant string
		conn   *ldap.Conn
		node   string // the slapd that answered
	}
	var all []*held
	for r, front := range fronts {
		for _, tenant := range tenants {
			for range perTenant {
				conn, err := ldap.DialURL("ldap://" + front)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				all = append(all, &held{router: r, tenant: tenant, conn: conn})
			}
		}
	}
	e2e.Together(len(all), func(i int) {
		h := all[i]
		if err := h.conn.Bind("uid=alice,o="+h.tenant+",dc=example", "pw-"+h.tenant); err != nil {
			t.Errorf("bind %s via router %d: %v", h.tenant, h.router, err)
			return
		}
		var err error
		if h.node, err = searchOn(h.conn); err != nil {
			t.Errorf("search %s via router %d: %v", h.tenant, h.router, err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	addrOf := map[string]string{}
	for a, n := range names {
		addrOf[n] = a
	}
	viaRouter := []map[string]int64{{}, {}} // node address → connections, per router
	for _, h := range all {
		own := placement.Rank(h.tenant, addrs)[:2]
		if !slices.Contains(own, addrOf[h.node]) {
			t.Fatalf("%s via router %d answered by %s, not one of its nodes %v", h.tenant, h.router, h.node, own)
		}
		viaRouter[h.router][addrOf[h.node]]++
	}
	for r, c := range routers {
		v := adminView(t, c)
		for _, tenant := range tenants {
			at := v.Tenants[tenant]
			if own := placement.Rank(tenant, addrs)[:2]; at.Connections != perTenant || !slices.Equal(at.Nodes, own) {
				t.Fatalf("router %d: admin view of %s: %+v, want %d connections on %v", r, tenant, at, perTenant, own)
			}
		}
		for _, a := range addrs {
			if v.OpenConnections[a] != viaRouter[r][a] {
				t.Fatalf("router %d counts %v, but clients through it reached %v: least connections must be per router",
					r, v.OpenConnections, viaRouter[r])
			}
		}
		t.Logf("%s router %d: open connections per node %v", membership, r, v.OpenConnections)
	}
}
