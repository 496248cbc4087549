package tenantroute_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// A tenant with few connections but many requests grows: acme holds 4
// connections (globex 3, idle) and searches on all of them in a loop.
// With only target_requests_per_node 20 (k = 2: grow above 40 requests per
// second, measured by the router from the LDAP envelope of each client
// message), acme's k becomes 3, the change is in the history with its
// reason, its connections stay where they are, and a new wave reaches its
// third node. When the searches stop, k shrinks back after cool_down,
// without closing a connection. globex keeps its nodes throughout.
func TestBusyTenantGrowsByRequestRate(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 5, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", autoConfig(front, addrs, `auto_partitions {
						target_requests_per_node 20
						max 3
						cool_down 2s
					}`))
	c.WaitTCP(t, front)
	others := wave(t, front, "globex", 3)
	acme := wave(t, front, "acme", 4)
	before := adminView(t, c)
	ranked := placement.Rank("acme", before.Nodes)
	for _, b := range acme {
		if node := addrOfMarker(t, b.node, before.Nodes, addrs); !slices.Contains(ranked[:2], node) {
			t.Fatalf("an acme connection on %s, outside its first two nodes", node)
		}
	}

	stop := e2e.Loop(len(acme), func(i int) bool {
		b := acme[i]
		if node, err := searchOn(b.conn); err != nil || node != b.node {
			t.Errorf("a search on %s answered by %q: %v", b.node, node, err)
			return false
		}
		return true
	})
	v := waitView(t, c, "acme grown by its request rate", func(v viewT) bool { return v.Tenants["acme"].Partitions == 3 })
	stop()
	at := v.Tenants["acme"]
	if at.Connections != 4 || !strings.Contains(at.PartitionsChangeReason, "requests per second over 2 nodes: above target_requests_per_node 20") {
		t.Fatalf("acme %+v", at)
	}
	if len(v.PartitionHistory) != 1 || v.PartitionHistory[0].Tenant != "acme" || v.PartitionHistory[0].Direction != "grow" ||
		v.PartitionHistory[0].From != 2 || v.PartitionHistory[0].To != 3 {
		t.Fatalf("history %+v", v.PartitionHistory)
	}
	if at, err := time.Parse(time.RFC3339Nano, v.PartitionHistory[0].Time); err != nil || at.Format(time.RFC3339Nano) != at.UTC().Format(time.RFC3339Nano) ||
		v.PartitionHistory[0].Reason != v.Tenants["acme"].PartitionsChangeReason {
		t.Fatalf("history entry %+v: %v", v.PartitionHistory[0], err)
	}
	if !slices.Equal(v.Tenants["globex"].Nodes, before.Tenants["globex"].Nodes) || v.Tenants["globex"].Partitions != 2 {
		t.Fatalf("globex moved: %v → %v", before.Tenants["globex"].Nodes, v.Tenants["globex"].Nodes)
	}
	stillThere(t, "after growing", acme)

	// New connections may take the third node now; before, none could.
	more := wave(t, front, "acme", 6)
	third := 0
	for _, b := range more {
		if addrOfMarker(t, b.node, v.Nodes, addrs) == ranked[2] {
			third++
		}
	}
	if third == 0 {
		t.Fatalf("none of 6 new connections reached acme's third node %s", ranked[2])
	}

	// Idle now: k shrinks after cool_down; nothing is closed.
	v = waitView(t, c, "acme shrunk when idle", func(v viewT) bool { return v.Tenants["acme"].Partitions == 2 })
	if at := v.Tenants["acme"]; at.Connections != 10 || at.PartitionsChangeDir != "shrink" || at.RequestsPerSecond >= 30 {
		t.Fatalf("acme after shrinking: %+v", at)
	}
	if h := v.PartitionHistory; len(h) != 2 || h[1].Direction != "shrink" || h[1].From != 3 || h[1].To != 2 {
		t.Fatalf("history %+v", h)
	}
	stillThere(t, "after shrinking", append(acme, more...))
	stillThere(t, "others", others)
}

// addrOfMarker maps a node's marker (node-1…) to its address: the markers
// are given in the order of addrs.
func addrOfMarker(t *testing.T, marker string, _ []string, addrs []string) string {
	t.Helper()
	for i, a := range addrs {
		if marker == "node-"+string(rune('1'+i)) {
			return a
		}
	}
	t.Fatalf("unknown marker %q", marker)
	return ""
}
