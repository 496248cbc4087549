package tenantroute_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// Membership from etcd: three slapd nodes registered with leases. A fourth
// registering takes over exactly the tenants whose first node it becomes
// (each tenant's connection reaches its first node in rendezvous order,
// as nothing else is open); a node that leaves (deletes its key) and a
// node whose lease lapses hand their tenants to the next node. With etcd
// gone, routing goes on with the last members and membership_stale is 1;
// with etcd back, it is 0 again and the admin view shows no error.
func TestEtcdMembership(t *testing.T) {
	dir, client, peer := t.TempDir(), e2e.Addr(t), e2e.Addr(t)
	etcdProc, etcdURL := e2e.StartEtcdAt(t, dir, client, peer)
	reg := newRegistry(t, etcdURL)
	addrs, names := startNodes(t, 4, ldifWithCandidates)
	for i := range 3 {
		reg.join(names[addrs[i]], addrs[i], 10)
	}
	// Tenants: two whose first node among all four is node-4 (the join
	// moves them to it), two whose first is node-3 (the leave moves them),
	// two others.
	var chosen []string
	count := map[string]int{}
	for _, tenant := range candidates() {
		first := names[placement.Rank(tenant, addrs)[0]]
		if first == "node-1" || first == "node-2" {
			first = "other"
		}
		if count[first] < 2 {
			count[first]++
			chosen = append(chosen, tenant)
		}
	}
	if len(chosen) != 6 {
		t.Fatalf("could not choose tenants: %v", count)
	}
	front := e2e.Addr(t)
	c := startEtcdExample(t, front, etcdURL)
	stale := func() float64 {
		n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_membership_stale{handler="ldap"}`)
		return n
	}

	// route connects once per tenant, one at a time with nothing else open,
	// and checks each reaches its first node among members; it returns how
	// many reached each node.
	route := func(when string, members []string) map[string]int {
		t.Helper()
		per := map[string]int{}
		for _, tenant := range chosen {
			waitIdle(t, c)
			conn, err := ldap.DialURL("ldap://" + front)
			if err != nil {
				t.Fatal(err)
			}
			got, want := marker(t, conn, tenant), names[placement.Rank(tenant, members)[0]]
			conn.Close()
			if got != want {
				t.Fatalf("%s: %s reached %s, want %s (first of %v)", when, tenant, got, want, members)
			}
			per[got]++
		}
		return per
	}
	waitMembers(t, c, addrs[:3])
	route("three members", addrs[:3])
	// The published assignment (TestAssignmentFollowsMembership has more).
	if got, want := reg.assignments()[chosen[0]], placement.Rank(chosen[0], addrs[:3])[:2]; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}

	// node-4 joins: its tenants reach it.
	reg.join("node-4", addrs[3], 3) // a short lease: it lapses below
	waitMembers(t, c, addrs)
	if per := route("after the join", addrs); per["node-4"] != 2 {
		t.Fatalf("after the join node-4 answered %d tenants, want 2", per["node-4"])
	}
	// node-3 leaves: its tenants go to their next node.
	reg.leave("node-3")
	three := []string{addrs[0], addrs[1], addrs[3]}
	waitMembers(t, c, three)
	route("after node-3 left", three)
	// node-4's lease lapses: the same.
	reg.lapse("node-4")
	waitMembers(t, c, addrs[:2])
	route("after node-4's lease lapsed", addrs[:2])
	if stale() != 0 {
		t.Fatal("membership_stale set while etcd answers")
	}

	// etcd goes away: routing goes on with the last known members, and
	// says so in the log, the metric and the admin view.
	etcdProc.Kill()
	waitView(t, c, "etcd shown as unreachable", func(v viewT) bool { return v.MembershipError != "" })
	if stale() != 1 {
		t.Fatal("membership_stale not set with etcd gone")
	}
	c.WaitLog(t, "etcd unreachable: routing on with the last known members", 5*time.Second)
	route("without etcd", addrs[:2])
	if v := adminView(t, c); !slices.Equal(v.Nodes, sortedCopy(addrs[:2])) || v.Membership != "etcd" || v.MembershipAgeMS == nil || v.MembershipUpdated == "" {
		t.Fatalf("view without etcd: %+v", v)
	} else if updated, err := time.Parse(time.RFC3339Nano, v.MembershipUpdated); err != nil || time.Since(updated) > time.Minute {
		t.Fatalf("membership_updated %q: %v", v.MembershipUpdated, err)
	}

	// etcd is back (same data): the metric and the view clear.
	e2e.StartEtcdAt(t, dir, client, peer)
	waitView(t, c, "etcd answering again", func(v viewT) bool { return v.MembershipError == "" })
	waitMembers(t, c, addrs[:2])
	if stale() != 0 {
		t.Fatal("membership_stale still set with etcd back")
	}
	route("with etcd back", addrs[:2])
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
