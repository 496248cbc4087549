package tenantroute_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// Membership from etcd: three slapd nodes registered with leases; a fourth
// registering takes over only its share of tenants; the router publishes
// each tenant's nodes; with etcd gone it routes on with the last members.
func TestEtcdMembership(t *testing.T) {
	etcdProc, etcdURL := e2e.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	register := func(name, addr string) {
		lease, err := cli.Grant(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "/edgesteer/ldap/nodes/"+name, addr, clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.KeepAlive(ctx, lease.ID); err != nil {
			t.Fatal(err)
		}
	}
	names := map[string]string{}
	var addrs []string
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("node-%d", i)
		s := e2e.StartSlapd(t, name, ldif(name))
		names[s.Addr] = name
		addrs = append(addrs, s.Addr)
		if i <= 3 {
			register(name, s.Addr)
		}
	}
	front := e2e.Addr(t)
	// The etcd example, with its addresses replaced.
	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "ldap-tenant-routing-etcd.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	c := e2e.StartCaddy(t, "caddyfile", strings.NewReplacer("127.0.0.1:3389", front,
		"http://127.0.0.1:2379", etcdURL).Replace(string(example)))
	c.WaitTCP(t, front)

	// where routes one connection per tenant and returns the node names.
	where := func() map[string]string {
		out := map[string]string{}
		for _, tenant := range tenants {
			conn, err := ldap.DialURL("ldap://" + front)
			if err != nil {
				t.Fatal(err)
			}
			out[tenant] = marker(t, conn, tenant)
			conn.Close()
		}
		return out
	}
	waitNodes := func(n int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for len(adminView(t, c).Nodes) != n {
			if time.Now().After(deadline) {
				t.Fatalf("members %v, want %d", adminView(t, c).Nodes, n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitNodes(3)
	before := where()
	for tenant, n := range before {
		own := placement.Rank(tenant, addrs[:3])[:2]
		if !slices.ContainsFunc(own, func(a string) bool { return names[a] == n }) {
			t.Fatalf("%s on %s, not on its nodes %v", tenant, n, own)
		}
	}
	// The published assignment.
	resp, err := cli.Get(ctx, "/edgesteer/ldap/assignments/acme")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("assignment of acme: %v %v", err, resp)
	}
	var published []string
	json.Unmarshal(resp.Kvs[0].Value, &published)
	if !slices.Equal(published, placement.Rank("acme", addrs[:3])[:2]) {
		t.Fatalf("published %v", published)
	}

	// node-4 joins: only tenants whose top 2 it enters move, and to it.
	register("node-4", addrs[3])
	waitNodes(4)
	for tenant, n := range where() {
		newOwn := placement.Rank(tenant, addrs)[:2]
		oldOwn := placement.Rank(tenant, addrs[:3])[:2]
		if !slices.ContainsFunc(newOwn, func(a string) bool { return names[a] == n }) {
			t.Fatalf("after the join %s is on %s, not on %v", tenant, n, newOwn)
		}
		if slices.Equal(newOwn, oldOwn) && n != before[tenant] && !slices.ContainsFunc(oldOwn, func(a string) bool { return names[a] == n }) {
			t.Fatalf("%s moved though its nodes did not change", tenant)
		}
	}

	// etcd goes away: routing goes on with the last known members.
	etcdProc.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for adminView(t, c).MembershipError == "" {
		if time.Now().After(deadline) {
			t.Fatal("the admin view does not show etcd as unreachable")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := where(); len(got) != len(tenants) {
		t.Fatalf("routing stopped without etcd: %v", got)
	}
	c.WaitLog(t, "etcd unreachable: routing on with the last known members", 5*time.Second)
	if v := adminView(t, c); len(v.Nodes) != 4 || v.Membership != "etcd" || !strings.Contains(v.MembershipAge, "s") {
		t.Fatalf("view without etcd: %+v", v)
	}
}
