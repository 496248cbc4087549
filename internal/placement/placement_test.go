package placement

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func nodes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("ldap-%d:389", i+1)
	}
	return out
}

func TestRankIsStableAndSpread(t *testing.T) {
	ns := nodes(5)
	if !slices.Equal(Rank("acme", ns), Rank("acme", []string{ns[4], ns[2], ns[0], ns[3], ns[1]})) {
		t.Fatal("rank depends on input order")
	}
	first := map[string]int{}
	for i := range 5000 {
		first[Rank(fmt.Sprint("tenant-", i), ns)[0]]++
	}
	for _, n := range ns {
		if first[n] < 800 || first[n] > 1200 {
			t.Fatalf("first choices %v: not spread", first)
		}
	}
	if weight("ab", "c") == weight("a", "bc") {
		t.Fatal("separator missing")
	}
}

// A node joining moves only the tenants whose top k it enters (≈ k/N of
// them); a node leaving moves only the tenants it held.
func TestMembershipChangeMovesKOverN(t *testing.T) {
	const tenants, k = 20000, 3
	p, _ := New(k)
	p.SetNodes(nodes(10))
	before := make([][]string, tenants)
	for i := range before {
		before[i] = p.Place(fmt.Sprint("tenant-", i))
	}
	p.SetNodes(nodes(11))
	moved := 0
	for i := range before {
		after := p.Place(fmt.Sprint("tenant-", i))
		if !slices.Equal(before[i], after) {
			moved++
			if !slices.Contains(after, "ldap-11:389") {
				t.Fatalf("tenant %d moved without the new node: %v → %v", i, before[i], after)
			}
		}
	}
	frac := float64(moved) / tenants
	t.Logf("join: %.3f of tenants moved (k/N = %.3f)", frac, float64(k)/11)
	if frac < 0.24 || frac > 0.31 {
		t.Fatalf("join moved %.3f of tenants, want ≈ %.3f", frac, float64(k)/11)
	}
	// ldap-4 leaves: only its tenants move.
	held := 0
	all := nodes(11)
	p.SetNodes(slices.DeleteFunc(slices.Clone(all), func(n string) bool { return n == "ldap-4:389" }))
	p2, _ := New(k)
	p2.SetNodes(all)
	for i := range tenants {
		tn := fmt.Sprint("tenant-", i)
		old, now := p2.Place(tn), p.Place(tn)
		had := slices.Contains(old, "ldap-4:389")
		if had {
			held++
		}
		if !had && !slices.Equal(old, now) {
			t.Fatalf("tenant %d moved though ldap-4 did not hold it", i)
		}
	}
	t.Logf("leave: %.3f of tenants moved", float64(held)/tenants)
}

// 300 connections of one tenant with k = 3: least connections spreads them
// evenly over its three nodes (max/mean ≤ 1.1), and no other node is used.
func TestLeastConnectionsAmongReplicas(t *testing.T) {
	p, _ := New(3)
	p.SetNodes(nodes(6))
	own := p.Place("acme")
	for range 300 {
		n, ok := p.Reserve("acme", time.Now())
		if !ok || !slices.Contains(own, n) {
			t.Fatalf("picked %s, tenant nodes %v", n, own)
		}
	}
	conns := p.Conns()
	maxC := int64(0)
	for _, n := range own {
		maxC = max(maxC, conns[n])
	}
	if ratio := float64(maxC) / 100; ratio > 1.1 {
		t.Fatalf("max/mean %.2f: %v", ratio, conns)
	}
	// Ties go by rendezvous order: with equal counts, the top-ranked node.
	q, _ := New(3)
	q.SetNodes(nodes(6))
	if n, _ := q.Reserve("acme", time.Now()); n != own[0] {
		t.Fatalf("tie went to %s, want %s", n, own[0])
	}
}

func TestDownNodesAreSkipped(t *testing.T) {
	p, _ := New(2)
	p.SetNodes(nodes(4))
	own := Rank("acme", p.Nodes())
	now := time.Now()
	p.MarkDown(own[0], now.Add(time.Minute))
	if n, _ := p.Reserve("acme", now); n != own[1] {
		t.Fatalf("with %s down picked %s, want %s", own[0], n, own[1])
	}
	p.MarkDown(own[1], now.Add(time.Minute))
	if n, _ := p.Reserve("acme", now); n != own[2] {
		t.Fatalf("with both down picked %s, want the next in rank %s", n, own[2])
	}
	if n, _ := p.Reserve("acme", now.Add(2*time.Minute)); n != own[0] {
		t.Fatalf("after the cool-off picked %s", n)
	}
	for _, n := range own {
		p.MarkDown(n, now.Add(time.Minute))
	}
	if _, ok := p.Reserve("acme", now); ok {
		t.Fatal("picked a node with all down")
	}
}

func TestPartitionOverrides(t *testing.T) {
	p, _ := New(2)
	p.SetNodes(nodes(6))
	if len(p.Place("big")) != 2 {
		t.Fatal("default k")
	}
	p.SetPartitions("big", 5)
	got := p.Place("big")
	if len(got) != 5 || !slices.Equal(got[:2], Rank("big", nodes(6))[:2]) {
		t.Fatalf("k=5 placement %v must extend the k=2 one", got)
	}
	p.SetPartitions("big", 0)
	if p.Partitions("big") != 2 {
		t.Fatal("override not cleared")
	}
	if _, err := New(0); err == nil {
		t.Fatal("k=0 accepted")
	}
}

// A reload hands the placer to the next config generation: it applies the
// new settings and keeps the live counts and run-time overrides, except a
// run-time override of a tenant whose configured count the reload changed.
func TestReconfigureKeepsProcessState(t *testing.T) {
	p, _ := New(1)
	p.Configure(1, map[string]int{"big": 2, "edited": 2})
	all := nodes(4)
	p.SetNodes(all)
	own := Rank("acme", all)
	for range 6 {
		p.Reserve("acme", time.Now())
	}
	if c := p.Conns()[own[0]]; c != 6 {
		t.Fatalf("k=1: %d connections on %s", c, own[0])
	}
	p.SetPartitions("globex", 3)
	p.SetPartitions("big", 4)
	p.SetPartitions("edited", 4)

	// The next generation: k 2, "edited" changed in the config.
	if err := p.Configure(2, map[string]int{"big": 2, "edited": 3}); err != nil {
		t.Fatal(err)
	}
	if got := p.RuntimeOverrides(); len(got) != 2 || got["globex"] != 3 || got["big"] != 4 {
		t.Fatalf("run-time overrides after the reload: %v", got)
	}
	if p.Partitions("edited") != 3 || p.Partitions("acme") != 2 || p.Partitions("big") != 4 {
		t.Fatalf("partitions edited %d acme %d big %d", p.Partitions("edited"), p.Partitions("acme"), p.Partitions("big"))
	}
	// The 6 live connections still count: the next 6 go to the other node.
	for range 6 {
		n, _ := p.Reserve("acme", time.Now())
		if n != own[1] {
			t.Fatalf("after the reload picked %s, want the less loaded %s (counts %v)", n, own[1], p.Conns())
		}
	}
	if err := p.Configure(0, nil); err == nil {
		t.Fatal("k=0 accepted")
	}
	if err := p.Configure(2, map[string]int{"x": 0}); err == nil {
		t.Fatal("tenant k=0 accepted")
	}
}

// A node removed while it holds connections: not picked, its count listed
// until the last one is released, then forgotten; re-added, it counts again.
func TestRemovedNodeCountedUntilReleased(t *testing.T) {
	p, _ := New(2)
	all := nodes(3)
	p.SetNodes(all)
	own := Rank("acme", all)
	p.acquire(own[0])
	p.acquire(own[0])
	p.MarkDown(own[0], time.Now().Add(time.Hour))
	p.SetNodes(own[1:])
	if c, ok := p.Conns()[own[0]]; !ok || c != 2 {
		t.Fatalf("removed node's live count: %v", p.Conns())
	}
	for range 4 {
		if n, _ := p.Reserve("acme", time.Now()); n == own[0] {
			t.Fatal("picked a removed node")
		}
	}
	p.Release(own[0])
	if p.Conns()[own[0]] != 1 {
		t.Fatalf("after one release: %v", p.Conns())
	}
	p.Release(own[0])
	if _, ok := p.Conns()[own[0]]; ok {
		t.Fatalf("removed node still listed with no connections: %v", p.Conns())
	}
	// Re-added: its cool-off was forgotten with it, and it is picked.
	p.SetNodes(all)
	if n, _ := p.Reserve("acme", time.Now()); n != own[0] {
		t.Fatalf("re-added node not picked: %s", n)
	}
	// A member's zero count stays listed.
	p.acquire(own[1])
	p.Release(own[1])
	if _, ok := p.Conns()[own[1]]; !ok {
		t.Fatal("a member's counter was dropped")
	}
}

// acquire counts a connection on node without choosing it.
func (p *Placer) acquire(node string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.conns[node].Add(1)
}

// A burst: connections of one tenant whose picks all happen before any of
// their dials completes. Each pick reserves its node, so they spread as if
// they came one at a time (and a failed dial gives its reservation back).
func TestConnectBurstSpreads(t *testing.T) {
	for _, k := range []int{2, 3} {
		t.Run(fmt.Sprint("k=", k), func(t *testing.T) {
			const n = 120
			p, _ := New(k)
			p.SetNodes(nodes(5))
			own := p.Place("acme")
			var picked sync.WaitGroup
			picked.Add(n)
			dial := func(node string) (string, error) {
				picked.Done()
				picked.Wait() // every connection has picked before any dial ends
				return node, nil
			}
			var done sync.WaitGroup
			for range n {
				done.Add(1)
				go func() {
					defer done.Done()
					if _, _, err := Connect(p, "acme", time.Minute, dial, nil); err != nil {
						t.Error(err)
					}
				}()
			}
			done.Wait()
			conns := p.Conns()
			for _, node := range own {
				if ratio := float64(conns[node]) / (n / float64(k)); ratio > 1.1 {
					t.Fatalf("burst of %d with k=%d: %v, max/mean %.2f", n, k, conns, ratio)
				}
			}
		})
	}
}

// A node that cannot be dialled is released, cools off and is reported;
// the next choice is dialled.
func TestConnectFailsOver(t *testing.T) {
	p, _ := New(2)
	p.SetNodes(nodes(4))
	own := p.Place("acme")
	var failed []string
	lease, conn, err := Connect(p, "acme", time.Minute, func(n string) (string, error) {
		if n == own[0] {
			return "", errors.New("refused")
		}
		return "conn to " + n, nil
	}, func(n string, err error) { failed = append(failed, n) })
	if err != nil || lease.Node != own[1] || conn != "conn to "+own[1] || !slices.Equal(failed, own[:1]) {
		t.Fatalf("got %+v %q %v, failed %v", lease, conn, err, failed)
	}
	if c := p.Conns(); c[own[0]] != 0 || c[own[1]] != 1 {
		t.Fatalf("counts %v: the failed dial kept its reservation", c)
	}
	// Every node refuses: one try each, then the last error.
	tries := 0
	_, _, err = Connect(p, "globex", time.Minute, func(string) (string, error) { tries++; return "", errors.New("down") }, nil)
	if err == nil || tries != 3 { // own[0] of acme is still cooling off
		t.Fatalf("all refusing: %v after %d tries", err, tries)
	}
	// An error wrapping ErrNoRetry: that node cools off, no other is tried.
	p2, _ := New(2)
	p2.SetNodes(nodes(4))
	tries = 0
	_, _, err = Connect(p2, "acme", time.Minute, func(string) (string, error) {
		tries++
		return "", fmt.Errorf("no answer: %w", ErrNoRetry)
	}, nil)
	if !errors.Is(err, ErrNoRetry) || tries != 1 || p2.Conns()[p2.Place("acme")[0]] != 0 {
		t.Fatalf("no retry: %v after %d tries, counts %v", err, tries, p2.Conns())
	}
	if n, _ := p2.Reserve("acme", time.Now()); n != p2.Place("acme")[1] {
		t.Fatalf("the unanswering node is not cooling off: picked %s", n)
	}
}

// Reserve then Release, as each routed connection does.
func BenchmarkReserveRelease(b *testing.B) {
	for _, n := range []int{4, 64} {
		b.Run(fmt.Sprint(n, " nodes"), func(b *testing.B) {
			p, _ := New(3)
			p.SetNodes(nodes(n))
			now := time.Now()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					node, _ := p.Reserve("acme", now)
					p.Release(node)
				}
			})
		})
	}
}

// PlaceAmong is Place on a node set not applied yet, with each tenant's k.
func TestPlaceAmongMatchesPlaceAfterTheChange(t *testing.T) {
	p, _ := New(2)
	p.Configure(2, map[string]int{"bigcorp": 3})
	p.SetNodes(nodes(4))
	next := append(nodes(5), "ldap-5:389") // a duplicate counts once
	for _, tenant := range []string{"acme", "bigcorp", "globex"} {
		want := p.PlaceAmong(tenant, next)
		p2, _ := New(2)
		p2.Configure(2, map[string]int{"bigcorp": 3})
		p2.SetNodes(next)
		if got := p2.Place(tenant); !slices.Equal(want, got) {
			t.Fatalf("%s: PlaceAmong %v, Place after SetNodes %v", tenant, want, got)
		}
	}
	if got := p.PlaceAmong("bigcorp", nodes(5)); len(got) != 3 {
		t.Fatalf("bigcorp's own k not used: %v", got)
	}
	if !slices.Equal(p.Nodes(), nodes(4)) {
		t.Fatal("PlaceAmong changed the live set")
	}
}
