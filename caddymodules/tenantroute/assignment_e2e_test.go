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

const (
	nodesPrefix  = "/edgesteer/ldap/nodes/"
	assignPrefix = "/edgesteer/ldap/assignments/"
)

// candidates are tenant names the etcd tests choose from once the nodes'
// addresses (random ports) are known, so that a join surely moves some.
func candidates() []string {
	out := make([]string, 48)
	for i := range out {
		out[i] = fmt.Sprintf("t%02d", i)
	}
	return out
}

// registry registers nodes in etcd the way the example says, each with a
// lease of its own kept alive until the test stops it.
type registry struct {
	t     *testing.T
	cli   *clientv3.Client
	stops map[string]context.CancelFunc
}

func newRegistry(t *testing.T, etcdURL string) *registry {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &registry{t: t, cli: cli, stops: map[string]context.CancelFunc{}}
}

// join registers name at addr with a lease of ttl seconds.
func (r *registry) join(name, addr string, ttl int64) {
	ctx, cancel := context.WithCancel(context.Background())
	lease, err := r.cli.Grant(ctx, ttl)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.cli.Put(ctx, nodesPrefix+name, addr, clientv3.WithLease(lease.ID)); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.cli.KeepAlive(ctx, lease.ID); err != nil {
		r.t.Fatal(err)
	}
	r.stops[name] = cancel
	r.t.Cleanup(cancel)
}

// leave deletes name's registration, as a node shutting down cleanly.
func (r *registry) leave(name string) {
	if _, err := r.cli.Delete(context.Background(), nodesPrefix+name); err != nil {
		r.t.Fatal(err)
	}
	r.stops[name]()
}

// lapse stops keeping name's lease alive, as a node that died: etcd drops
// the registration when the lease's time is up.
func (r *registry) lapse(name string) { r.stops[name]() }

// assignments reads every key under the assignment prefix.
func (r *registry) assignments() map[string][]string {
	resp, err := r.cli.Get(context.Background(), assignPrefix, clientv3.WithPrefix())
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, kv := range resp.Kvs {
		var nodes []string
		if err := json.Unmarshal(kv.Value, &nodes); err != nil {
			r.t.Fatalf("assignment %s = %q: %v", kv.Key, kv.Value, err)
		}
		out[strings.TrimPrefix(string(kv.Key), assignPrefix)] = nodes
	}
	return out
}

// startEtcdExample runs bin/caddy with the etcd example, its addresses
// replaced.
func startEtcdExample(t *testing.T, front, etcdURL string) *e2e.Caddy {
	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "ldap-tenant-routing-etcd.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	c := e2e.StartCaddy(t, "caddyfile", strings.NewReplacer("127.0.0.1:3389", front,
		"http://127.0.0.1:2379", etcdURL).Replace(string(example)))
	c.WaitTCP(t, front)
	return c
}

// waitMembers polls the admin view until the members are exactly nodes.
func waitMembers(t *testing.T, c *e2e.Caddy, nodes []string) {
	t.Helper()
	want := sortedCopy(nodes)
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := adminView(t, c)
		if slices.Equal(v.Nodes, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("members %v, want %v", v.Nodes, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitIdle polls the admin view until no connection is open, so that the
// next pick of a tenant is its first node in rendezvous order.
func waitIdle(t *testing.T, c *e2e.Caddy) {
	t.Helper()
	waitView(t, c, "no connection open", func(v viewT) bool {
		for _, n := range v.OpenConnections {
			if n != 0 {
				return false
			}
		}
		return true
	})
}

// The published assignment follows membership: a join, a leave and a lapsed
// lease each rewrite the assignment of every known tenant (configured:
// bigcorp with 3 partitions in the example; seen: tenants that connected;
// listed: a key under the prefix before the router started) to its new
// rendezvous top k, and the router uses the new members only after that:
// the moment the admin view shows them, the keys already name them, before
// any new connection of a moved tenant.
func TestAssignmentFollowsMembership(t *testing.T) {
	_, etcdURL := e2e.StartEtcd(t)
	reg := newRegistry(t, etcdURL)
	addrs, names := startNodes(t, 4, ldifWithCandidates)
	for i := range 3 {
		reg.join(names[addrs[i]], addrs[i], 10)
	}
	// Tenants listed under the prefix with an outdated value, as an earlier
	// run of the router would have left them: "listed" and 10 000 more, so
	// that publishing a change takes long enough for the order (assignment
	// first, then routing) to show.
	listed := []string{"listed"}
	for i := range 10000 {
		listed = append(listed, fmt.Sprintf("bulk-%05d", i))
	}
	for i := 0; i < len(listed); i += 128 {
		var ops []clientv3.Op
		for _, tenant := range listed[i:min(i+128, len(listed))] {
			ops = append(ops, clientv3.OpPut(assignPrefix+tenant, `["127.0.0.1:1"]`))
		}
		if _, err := reg.cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Seen tenants: 4 that node-4's join moves (it becomes their first
	// node), 4 that it does not move.
	var moving, staying []string
	for _, tenant := range candidates() {
		if r := placement.Rank(tenant, addrs); r[0] == addrs[3] {
			if len(moving) < 4 {
				moving = append(moving, tenant)
			}
		} else if !slices.Contains(r[:2], addrs[3]) && len(staying) < 4 {
			staying = append(staying, tenant)
		}
	}
	seen := append(slices.Clone(moving), staying...)
	if len(seen) != 8 {
		t.Fatalf("could not choose tenants: moving %v staying %v", moving, staying)
	}
	known := append(append(slices.Clone(seen), "bigcorp"), listed...)
	k := func(tenant string) int {
		if tenant == "bigcorp" {
			return 3
		}
		return 2
	}
	// check reads the keys once, no waiting: each known tenant's key must
	// already be its top k among members.
	check := func(when string, members []string) {
		t.Helper()
		got := reg.assignments()
		for _, tenant := range known {
			r := placement.Rank(tenant, members)
			if want := r[:min(k(tenant), len(r))]; !slices.Equal(got[tenant], want) {
				t.Fatalf("%s: assignment of %s is %v, want %v (members %v)", when, tenant, got[tenant], want, members)
			}
		}
	}

	front := e2e.Addr(t)
	c := startEtcdExample(t, front, etcdURL)
	waitMembers(t, c, addrs[:3])
	for _, tenant := range seen {
		waitIdle(t, c)
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := marker(t, conn, tenant), names[placement.Rank(tenant, addrs[:3])[0]]; got != want {
			t.Fatalf("%s reached %s, want %s", tenant, got, want)
		}
		conn.Close()
	}
	check("after the start", addrs[:3])

	// node-4 joins.
	reg.join("node-4", addrs[3], 3) // a short lease: it lapses below
	waitMembers(t, c, addrs)
	check("when the join took effect", addrs)
	for _, tenant := range moving {
		if !slices.Contains(reg.assignments()[tenant], addrs[3]) {
			t.Fatalf("%s did not move to node-4", tenant)
		}
	}
	// The first connection of each moved tenant reaches node-4.
	for _, tenant := range moving {
		waitIdle(t, c)
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		got := marker(t, conn, tenant)
		conn.Close()
		if got != "node-4" {
			t.Fatalf("after the join %s reached %s, want node-4", tenant, got)
		}
	}

	// node-3 leaves (deletes its registration).
	reg.leave("node-3")
	after := []string{addrs[0], addrs[1], addrs[3]}
	waitMembers(t, c, after)
	check("when the leave took effect", after)

	// node-4's lease lapses.
	reg.lapse("node-4")
	waitMembers(t, c, addrs[:2])
	check("when the lapse took effect", addrs[:2])
	if n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_membership_changes_total{handler="ldap"}`); n != 4 {
		t.Fatalf("membership changes %v, want 4 (start, join, leave, lapse)", n)
	}
}
