package tenantroute_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// autoConfig is the ldap router with k = 2 and extra options.
func autoConfig(front string, nodes []string, extra string) string {
	return ldapRouter(front, nodes, "partitions 2\n\t\t\t\t\t"+extra)
}

// boundConn is a client connection bound through the router, with the node
// that answered its first search.
type boundConn struct {
	conn *ldap.Conn
	node string
}

// wave dials n connections, then sends all their binds at once (so the
// router places them together) and returns them with the node each reached.
func wave(t *testing.T, front, tenant string, n int) []*boundConn {
	t.Helper()
	out := make([]*boundConn, n)
	for i := range out {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		out[i] = &boundConn{conn: conn}
	}
	e2e.Together(len(out), func(i int) {
		b := out[i]
		if err := b.conn.Bind("uid=alice,o="+tenant+",dc=example", "pw-"+tenant); err != nil {
			t.Errorf("bind %s: %v", tenant, err)
			return
		}
		var err error
		if b.node, err = searchOn(b.conn); err != nil {
			t.Errorf("search %s: %v", tenant, err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// stillThere checks every held connection still answers, from the node it
// reached first: nothing moved or dropped.
func stillThere(t *testing.T, when string, held []*boundConn) {
	t.Helper()
	for _, b := range held {
		if node, err := searchOn(b.conn); err != nil || node != b.node {
			t.Fatalf("%s: a connection on %s now answers %q, %v", when, b.node, node, err)
		}
	}
}

// Hot tenant: acme ramps in waves of 40 concurrent binds while three other
// tenants hold 3 connections each. auto_partitions (target 40 per node, max
// 5, cool-down 3 s) grows acme one step per wave past 80 connections, to all
// five nodes; the node totals over its nodes stay within max/mean ≤ 1.1;
// the others keep their nodes; no connection moves. Closing most of acme's
// connections shrinks it one step per cool-down, without closing any.
// A flood of failed binds naming globex changes neither its k nor the
// counts, and each flooding connection is closed after 3 failed binds.
func TestHotTenantGrowsAndShrinks(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 5, ldif)
	front := e2e.Addr(t)
	// The hot-tenant example, with its addresses replaced and a cool-down
	// a test can wait for.
	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "ldap-tenant-routing-hot.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	c := e2e.StartCaddy(t, "caddyfile", strings.NewReplacer("127.0.0.1:3389", front, "127.0.0.1:3891", addrs[0],
		"127.0.0.1:3892", addrs[1], "127.0.0.1:3893", addrs[2], "127.0.0.1:3894", addrs[3], "127.0.0.1:3895", addrs[4],
		"cool_down 5m", "cool_down 3s").Replace(string(example)))
	c.WaitTCP(t, front)
	if v := adminView(t, c); v.AutoPartitions == nil || v.AutoPartitions.CoolDownMS != 3000 || len(v.Nodes) != 5 {
		t.Fatalf("the example was not loaded as meant: %+v", v)
	}
	metric := func(series string) float64 {
		v, _ := c.Metric(t, series)
		return v
	}

	var others []*boundConn
	for _, tenant := range []string{"globex", "initech", "umbrella"} {
		others = append(others, wave(t, front, tenant, 3)...)
	}
	before := adminView(t, c)

	var acme []*boundConn
	var ks []int
	for range 5 {
		acme = append(acme, wave(t, front, "acme", 40)...)
		ks = append(ks, adminView(t, c).Tenants["acme"].Partitions)
	}
	if !slices.Equal(ks, []int{2, 2, 3, 4, 5}) {
		t.Fatalf("acme's k after each wave of 40: %v, want 2 2 3 4 5", ks)
	}
	v := adminView(t, c)
	if at := v.Tenants["acme"]; !slices.Equal(at.Nodes, placement.Rank("acme", addrs)) || at.PartitionsChangeDir != "grow" ||
		!strings.Contains(at.PartitionsChangeReason, "above target_per_node 40") || at.AuthenticatedConnections != 200 {
		t.Fatalf("acme in the admin view: %+v", at)
	}
	// acme's own connections, by which slapd answered: max/mean ≤ 1.1 over
	// its five nodes; and the node totals, which also hold the other
	// tenants' 9 connections (placed before, never moved).
	perNode := map[string]int{}
	for _, b := range acme {
		perNode[b.node]++
	}
	for node, n := range perNode {
		if float64(n)/40 > 1.1 {
			t.Fatalf("acme's 200 connections over 5 nodes %v: %s at max/mean %.2f", perNode, node, float64(n)/40)
		}
	}
	if len(perNode) != 5 {
		t.Fatalf("acme on %d nodes: %v", len(perNode), perNode)
	}
	var total, most int64
	for _, n := range v.OpenConnections {
		total, most = total+n, max(most, n)
	}
	if float64(most)/(float64(total)/5) > 1.1 {
		t.Fatalf("node totals %v: max/mean over 1.1", v.OpenConnections)
	}
	t.Logf("k per wave %v; node totals %v; acme by slapd %v", ks, v.OpenConnections, perNode)
	for _, tenant := range []string{"globex", "initech", "umbrella"} {
		if !slices.Equal(v.Tenants[tenant].Nodes, before.Tenants[tenant].Nodes) || v.Tenants[tenant].Partitions != 2 {
			t.Fatalf("%s moved: %v, before %v", tenant, v.Tenants[tenant], before.Tenants[tenant])
		}
	}
	if metric(`caddy_edgesteer_tenant_route_partitions{handler="ldap",tenant="acme"}`) != 5 ||
		metric(`caddy_edgesteer_tenant_route_partition_changes_total{direction="grow",handler="ldap"}`) != 3 {
		t.Fatal("metrics: acme's partitions or the grow count are not 5 and 3")
	}
	if n, ok := c.Metric(t, `caddy_edgesteer_tenant_route_partitions{handler="ldap",tenant="globex"}`); ok {
		t.Fatalf("globex at the default k is labelled: %v", n)
	}
	stillThere(t, "after the ramp", append(acme, others...))

	// A flood of failed binds naming globex: 30 connections at once, each
	// trying 3 wrong passwords; the router closes each after its third.
	counts := adminView(t, c).OpenConnections
	var wg sync.WaitGroup
	var closedAfter3 sync.WaitGroup
	for range 30 {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		wg.Add(1)
		closedAfter3.Add(1)
		go func() {
			defer wg.Done()
			defer closedAfter3.Done()
			for i := range 3 {
				err := conn.Bind("uid=alice,o=globex,dc=example", "wrong")
				if !ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
					t.Errorf("failed bind %d: %v", i+1, err)
					return
				}
			}
			conn.SetTimeout(10 * time.Second)
			if _, err := searchOn(conn); err == nil {
				t.Error("a connection with 3 failed binds still answers")
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	v = waitView(t, c, "the flood's connections closed", func(v viewT) bool { return v.UnauthenticatedConnections == 0 })
	if v.Tenants["globex"].Partitions != 2 || v.FailedBinds["globex"] != 90 || !maps64Equal(v.OpenConnections, counts) ||
		v.PartitionChanges["grow"] != 3 {
		t.Fatalf("after the flood: globex %+v, failed binds %v, counts %v (before %v), changes %v",
			v.Tenants["globex"], v.FailedBinds, v.OpenConnections, counts, v.PartitionChanges)
	}
	if metric(`caddy_edgesteer_tenant_route_failed_binds_total{handler="ldap"}`) != 90 ||
		metric(`caddy_edgesteer_tenant_route_failed_bind_closes_total{handler="ldap"}`) != 30 {
		t.Fatal("failed bind metrics are not 90 and 30")
	}
	stillThere(t, "after the flood", append(acme, others...))

	// Ramp-down: 190 of acme's 200 close; 10 stay open. Below half the
	// target for 3 s per step: 5 → 4 → 3 → 2, and nothing else closes.
	for _, b := range acme[10:] {
		b.conn.Close()
	}
	acme = acme[:10]
	var steps []int
	deadline := time.Now().Add(60 * time.Second)
	for {
		k := adminView(t, c).Tenants["acme"].Partitions
		if len(steps) == 0 || steps[len(steps)-1] != k {
			steps = append(steps, k)
		}
		if k == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme did not shrink to 2: steps %v", steps)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(steps, []int{5, 4, 3, 2}) {
		t.Fatalf("shrink steps %v, want 5 4 3 2", steps)
	}
	if at := adminView(t, c).Tenants["acme"]; at.PartitionsChangeDir != "shrink" || at.Connections != 10 {
		t.Fatalf("acme after the ramp-down: %+v", at)
	}
	if metric(`caddy_edgesteer_tenant_route_partition_changes_total{direction="shrink",handler="ldap"}`) != 3 {
		t.Fatal("shrink count is not 3")
	}
	stillThere(t, "after the ramp-down", append(acme, others...))
}

func maps64Equal(a, b map[string]int64) bool {
	for k := range a {
		if a[k] != b[k] {
			return false
		}
	}
	for k := range b {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

// Per-node ceilings: with max_per_node 4, a tenant whose nodes are full
// grows (auto max 3) and then new connections get LDAP busy (51), counted;
// the connections held keep working and another tenant is still served.
func TestMaxPerNodeRefusesBusy(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 5, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", autoConfig(front, addrs, `auto_partitions {
						target_per_node 100
						max 3
					}
					max_per_node 4`))
	c.WaitTCP(t, front)
	var held []*boundConn
	for range 3 { // one wave per node's worth
		held = append(held, wave(t, front, "acme", 4)...)
	}
	v := adminView(t, c)
	if at := v.Tenants["acme"]; at.Partitions != 3 || !strings.Contains(at.PartitionsChangeReason, "max_per_node") {
		t.Fatalf("acme with its nodes full: %+v", at)
	}
	for node, n := range v.OpenConnections {
		if n > 4 {
			t.Fatalf("%s holds %d, over max_per_node", node, n)
		}
	}
	// Five more at once: every one refused with busy.
	var wg sync.WaitGroup
	for range 5 {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := conn.Bind("uid=alice,o=acme,dc=example", "pw-acme")
			var le *ldap.Error
			if !errors.As(err, &le) || le.ResultCode != ldap.LDAPResultBusy {
				t.Errorf("bind past the ceilings: %v, want LDAP busy (51)", err)
			}
		}()
	}
	wg.Wait()
	if n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_busy_refusals_total{handler="ldap"}`); n != 5 {
		t.Fatalf("busy refusals %v, want 5", n)
	}
	stillThere(t, "after the refusals", held)
	// Another tenant is still served (its own nodes, or grown past full
	// ones), unless its three candidate nodes are acme's three full ones:
	// with 5 nodes on random ports, 1 chance in 10, and then it is refused
	// in the same way.
	if full, candidates := placement.Rank("acme", addrs)[:3], placement.Rank("globex", addrs)[:3]; sameSet(full, candidates) {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var le *ldap.Error
		if err := conn.Bind("uid=alice,o=globex,dc=example", "pw-globex"); !errors.As(err, &le) || le.ResultCode != ldap.LDAPResultBusy {
			t.Fatalf("globex, whose candidates are all full: %v, want LDAP busy (51)", err)
		}
		t.Logf("globex's candidate nodes are acme's full ones: refused busy, as the rule says")
		return
	}
	wave(t, front, "globex", 2)
	if n := adminView(t, c).BusyRefusals; n != 5 {
		t.Fatalf("admin view busy_refusals %d", n)
	}
}

// With etcd, a grown or shrunk k is published under the assignment prefix:
// the key names the tenant's new node by the time a connection reached it,
// and its former node set after a shrink.
func TestGrownPartitionsPublished(t *testing.T) {
	e2e.SkipShort(t)
	_, etcdURL := e2e.StartEtcd(t)
	reg := newRegistry(t, etcdURL)
	addrs, names := startNodes(t, 4, ldif)
	for _, a := range addrs {
		reg.join(names[a], a, 10)
	}
	front := e2e.Addr(t)
	config := func(sizes string) string {
		return bindRoute(front, fmt.Sprintf(`name ldap
					partitions 2
					auto_partitions {
						target_per_node 5
						cool_down 2s
					}
					etcd %s {
						prefix %s
						assignment_prefix %s
						%s
					}`, etcdURL, nodesPrefix, assignPrefix, sizes))
	}
	c := e2e.StartCaddy(t, "caddyfile", config(""))
	c.WaitTCP(t, front)
	waitMembers(t, c, addrs)
	rank := placement.Rank("acme", addrs)
	var held []*boundConn
	for range 3 {
		held = append(held, wave(t, front, "acme", 5)...)
	}
	if got := reg.assignments()["acme"]; !slices.Equal(got, rank[:3]) {
		t.Fatalf("acme grown to 3: assignment %v, want %v", got, rank[:3])
	}
	for _, b := range held {
		if !slices.Contains(rank[:3], addrOfName(names, b.node)) {
			t.Fatalf("a connection reached %s, outside %v", b.node, rank[:3])
		}
	}
	for _, b := range held[1:] {
		b.conn.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(reg.assignments()["acme"], rank[:2]) {
		if time.Now().After(deadline) {
			t.Fatalf("after the shrink: assignment %v, want %v", reg.assignments()["acme"], rank[:2])
		}
		time.Sleep(100 * time.Millisecond)
	}
	stillThere(t, "after the shrink", held[:1])
	etcdSizes(t, c, reg, front, addrs, config) // shares this set-up
}

func addrOfName(names map[string]string, name string) string {
	for a, n := range names {
		if n == name {
			return a
		}
	}
	return ""
}

// Hysteresis through bin/caddy: a tenant whose load swings around its
// growth threshold (T·k = 10 with target 5, k = 2) grows once, then stays:
// the swings never reach the new shrink threshold (7.5) nor the next growth
// threshold (15).
func TestOscillatingLoadChangesKOnce(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 4, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", autoConfig(front, addrs, `auto_partitions {
						target_per_node 5
						cool_down 1s
					}`))
	c.WaitTCP(t, front)
	held := append(wave(t, front, "acme", 5), wave(t, front, "acme", 4)...) // 9: below T·k
	for swing := range 6 {
		extra := wave(t, front, "acme", 3) // 12: above T·k while k = 2
		for _, b := range extra {
			b.conn.Close()
		}
		waitView(t, c, "the swing's connections closed", func(v viewT) bool { return v.Tenants["acme"].Connections == 9 })
		time.Sleep(2 * time.Second) // past cool_down and a tick: a shrink would have had its chance
		v := adminView(t, c)
		if v.Tenants["acme"].Partitions != 3 || v.PartitionChanges["grow"] != 1 || v.PartitionChanges["shrink"] != 0 {
			t.Fatalf("swing %d: acme %+v, changes %v: want grown once to 3", swing, v.Tenants["acme"], v.PartitionChanges)
		}
	}
	stillThere(t, "after the swings", held)

	// A reload keeps the grown count and the tenant's load (process state).
	c.Reload(t, "caddyfile", autoConfig(front, addrs, `auto_partitions {
						target_per_node 5
						cool_down 2s
					}`))
	v := waitView(t, c, "the reloaded cool-down", func(v viewT) bool {
		return v.AutoPartitions != nil && v.AutoPartitions.CoolDownMS == 2000
	})
	if at := v.Tenants["acme"]; at.Partitions != 3 || at.AuthenticatedConnections != 9 {
		t.Fatalf("after a reload: acme %+v", at)
	}
	stillThere(t, "after the reload", held)
}

// sameSet says whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(b, x) })
}
