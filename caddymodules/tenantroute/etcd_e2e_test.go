package tenantroute_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// The etcd membership watch is pooled with the handler's state: reloads
// (the CLI and POST /load) keep one watch on etcd, the membership it found
// and the connections counted; etcd is still consulted after them; the
// watch stops when the last config using the name goes.
func TestEtcdWatchSurvivesReload(t *testing.T) {
	_, etcdURL := e2e.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	var addrs []string
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("node-%d", i)
		s := e2e.StartSlapd(t, name, ldif(name))
		addrs = append(addrs, s.Addr)
		if i <= 3 {
			if _, err := cli.Put(ctx, "/edgesteer/ldap/nodes/"+name, s.Addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	front := e2e.Addr(t)
	config := func(dial string) string {
		return fmt.Sprintf(`{
	layer4 {
		%s {
			route {
				tenant_route {
					name ldap
					nodes %s
					dial_timeout %s
					etcd %s {
						prefix /edgesteer/ldap/nodes/
					}
				}
			}
		}
	}
}
`, front, addrs[3], dial, etcdURL) // addrs[3]: the starting set, until etcd answers
	}
	// watchers is etcd's own count of open watches.
	watchers := func() float64 {
		resp, err := http.Get(etcdURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "etcd_debugging_mvcc_watcher_total "); ok {
				var n float64
				fmt.Sscan(v, &n)
				return n
			}
		}
		t.Fatal("etcd reports no watcher count")
		return 0
	}
	waitWatchers := func(n float64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for watchers() != n {
			if time.Now().After(deadline) {
				t.Fatalf("etcd has %v watchers, want %v", watchers(), n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	etcdMembers := func(v viewT) bool {
		return v.Membership == "etcd" && v.MembershipError == "" && slices.Equal(v.Nodes, sortedCopy(addrs[:3]))
	}
	c := e2e.StartCaddy(t, "caddyfile", config("3s"))
	c.WaitTCP(t, front)
	waitView(t, c, "the members registered in etcd", etcdMembers)
	waitWatchers(1)
	_, held := hold(t, front, "acme", 4)
	defer func() {
		for _, conn := range held {
			conn.Close()
		}
	}()

	for i, how := range []string{"caddy reload", "POST /load", "caddy reload"} {
		loader(c, how)(t, config(fmt.Sprintf("%ds", 4+i)))
		// Straight after the reload: still the members from etcd, not the
		// starting set, and the held connections counted.
		v := adminView(t, c)
		if !etcdMembers(v) || v.Tenants["acme"].Connections != 4 {
			t.Fatalf("after %s: %+v", how, v)
		}
		waitWatchers(1)
		for j, conn := range held {
			if _, err := searchOn(conn); err != nil {
				t.Fatalf("after %s: held connection %d: %v", how, j, err)
			}
		}
	}
	// etcd is still consulted: node-4 registers, the router sees it.
	if _, err := cli.Put(ctx, "/edgesteer/ldap/nodes/node-4", addrs[3]); err != nil {
		t.Fatal(err)
	}
	waitView(t, c, "node-4 from etcd after the reloads", func(v viewT) bool { return len(v.Nodes) == 4 })
	if n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_membership_changes_total{handler="ldap"}`); n != 2 {
		t.Fatalf("membership changes %v, want 2 (the first load from etcd and node-4)", n)
	}

	// A config without tenant_route: the watch stops.
	loader(c, "POST /load")(t, fmt.Sprintf("{\n\tlayer4 {\n\t\t%s {\n\t\t\troute {\n\t\t\t\tproxy %s\n\t\t\t}\n\t\t}\n\t}\n}\n", front, addrs[0]))
	waitWatchers(0)
	var views []viewT
	c.AdminJSON(t, "/tenant_route/", &views)
	if len(views) != 0 {
		t.Fatalf("views with no tenant_route configured: %+v", views)
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
