package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func autoPlacer(t *testing.T, n, k int, auto *Auto, maxPerNode int) *Placer {
	t.Helper()
	p, _ := New(k)
	p.SetNodes(nodes(n))
	if err := p.SetLimits(auto, maxPerNode); err != nil {
		t.Fatal(err)
	}
	return p
}

// arrive acquires n connections of tenant at once (concurrently), then
// answers their binds with ok.
func arrive(t *testing.T, p *Placer, tenant string, n int, ok bool, now time.Time) []*Lease {
	t.Helper()
	leases := make([]*Lease, n)
	var wg sync.WaitGroup
	for i := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.Acquire(tenant, now)
			if err != nil {
				t.Error(err)
				return
			}
			leases[i] = l
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, l := range leases {
		l.Bound(ok, now)
	}
	return leases
}

// perNode counts leases by node.
func perNode(leases []*Lease) map[string]int {
	out := map[string]int{}
	for _, l := range leases {
		out[l.Node]++
	}
	return out
}

// A tenant that ramps in concurrent waves grows one step at a time, each
// new node being the next in its rendezvous order; its connections stay
// where they are and spread evenly (max/mean ≤ 1.1) over its nodes; other
// tenants keep their nodes.
func TestAutoGrowsStepByStep(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 6, 2, &Auto{TargetPerNode: 10, Max: 5, CoolDown: time.Minute}, 0)
	otherBefore := p.Place("globex")
	var held []*Lease
	var ks []int
	for range 6 {
		held = append(held, arrive(t, p, "acme", 10, true, now)...)
		ks = append(ks, p.Explain("acme", now).Partitions)
	}
	// 10, 20: k=2; 30: 3; 40: 4; 50: 5; 60: max 5.
	if !slices.Equal(ks, []int{2, 2, 3, 4, 5, 5}) {
		t.Fatalf("k after each wave of 10: %v", ks)
	}
	own := Rank("acme", p.Nodes())[:5]
	spread := perNode(held)
	for node, n := range spread {
		if !slices.Contains(own, node) {
			t.Fatalf("a connection on %s, outside acme's top 5 %v", node, own)
		}
		if float64(n)/12 > 1.1 {
			t.Fatalf("60 connections over 5 nodes: %v", spread)
		}
	}
	if e := p.Explain("acme", now); e.Source != SourceAuto || !strings.Contains(p.Loads()["acme"].Reason, "above target_per_node") {
		t.Fatalf("acme: %+v %+v", e, p.Loads()["acme"])
	}
	if !slices.Equal(p.Place("globex"), otherBefore) || p.Grown()["acme"] != 5 || len(p.Grown()) != 1 {
		t.Fatalf("others moved or grown: %v %v", p.Place("globex"), p.Grown())
	}
	if c := p.Counters(); c.Grown != 3 || c.Shrunk != 0 {
		t.Fatalf("changes %+v", c)
	}
}

// Shrinking: with load below half the target for cool_down, k drops one
// step, and another cool_down must pass for the next. No lease changes
// node; the dropped node takes no new connection of the tenant.
func TestAutoShrinksAfterCoolDown(t *testing.T) {
	now := time.Now()
	cool := 30 * time.Second
	p := autoPlacer(t, 5, 2, &Auto{TargetPerNode: 10, CoolDown: cool}, 0)
	var held []*Lease
	for range 5 { // 10 per node over 5
		held = append(held, arrive(t, p, "acme", 10, true, now)...)
	}
	if k := p.Explain("acme", now).Partitions; k != 5 {
		t.Fatalf("k = %d after 50", k)
	}
	where := map[*Lease]string{}
	for _, l := range held {
		where[l] = l.Node
	}
	for _, l := range held[:36] { // 14 left: below 5·10/2 = 25
		l.Release(now)
	}
	p.Tick(now.Add(cool - time.Second))
	if k := p.Explain("acme", now).Partitions; k != 5 {
		t.Fatalf("shrunk before its cool-down: k = %d", k)
	}
	p.Tick(now.Add(cool))
	if k := p.Explain("acme", now).Partitions; k != 4 {
		t.Fatalf("k = %d after one cool-down, want 4", k)
	}
	p.Tick(now.Add(cool + time.Second)) // 14 < 4·10/2: below, but the clock restarted
	if k := p.Explain("acme", now).Partitions; k != 4 {
		t.Fatalf("two steps in one cool-down: k = %d", k)
	}
	p.Tick(now.Add(2 * cool))
	if k := p.Explain("acme", now).Partitions; k != 3 { // 14 ≥ 3·10/2 = 15? no: 14 < 15
		t.Fatalf("k = %d after two cool-downs, want 3", k)
	}
	p.Tick(now.Add(3 * cool))
	if k := p.Explain("acme", now).Partitions; k != 2 { // 14 ≥ 2·10/2: stays at 2 = base anyway
		t.Fatalf("k = %d after three cool-downs, want 2", k)
	}
	for _, l := range held[36:] {
		if l.Node != where[l] {
			t.Fatal("a live connection moved")
		}
	}
	own := Rank("acme", p.Nodes())[:2]
	for _, l := range arrive(t, p, "acme", 6, true, now.Add(3*cool)) {
		if !slices.Contains(own, l.Node) {
			t.Fatalf("after shrinking a new connection went to %s, not %v", l.Node, own)
		}
	}
	if c := p.Counters(); c.Grown != 3 || c.Shrunk != 3 {
		t.Fatalf("changes %+v", c)
	}
}

// Hysteresis: a load that oscillates around the growth threshold (T·k)
// changes k once, not on every swing; one that oscillates around the
// shrink threshold after that never shrinks while it keeps crossing back
// within the cool-down.
func TestAutoHysteresis(t *testing.T) {
	now := time.Now()
	cool := 10 * time.Second
	p := autoPlacer(t, 8, 2, &Auto{TargetPerNode: 10, CoolDown: cool}, 0)
	held := arrive(t, p, "acme", 18, true, now)
	for swing := range 20 { // 18 ↔ 22 around T·k = 20
		now = now.Add(time.Second)
		held = append(held, arrive(t, p, "acme", 4, true, now)...)
		for _, l := range held[len(held)-4:] {
			l.Release(now)
		}
		held = held[:len(held)-4]
		p.Tick(now)
		if k := p.Explain("acme", now).Partitions; k != 3 {
			t.Fatalf("swing %d: k = %d, want 3 (grown once)", swing, k)
		}
	}
	if c := p.Counters(); c.Grown != 1 || c.Shrunk != 0 {
		t.Fatalf("around the growth threshold: %+v, want 1 change", c)
	}
	// Around the shrink threshold of k=3 (15): 13 ↔ 17, each dip shorter
	// than the cool-down.
	for _, l := range held[:5] {
		l.Release(now)
	}
	held = held[5:] // 13
	for swing := range 10 {
		now = now.Add(cool / 2)
		p.Tick(now)
		held = append(held, arrive(t, p, "acme", 4, true, now)...) // 17
		now = now.Add(time.Second)
		p.Tick(now)
		for _, l := range held[len(held)-4:] {
			l.Release(now)
		}
		held = held[:len(held)-4]
		if k := p.Explain("acme", now).Partitions; k != 3 {
			t.Fatalf("swing %d around the shrink threshold: k = %d", swing, k)
		}
	}
	if c := p.Counters(); c.Grown != 1 || c.Shrunk != 0 {
		t.Fatalf("around the shrink threshold: %+v", c)
	}
}

// Only authenticated load counts: a flood of connections naming a tenant
// whose binds fail neither grows it nor fills its nodes; a failed bind
// uncounts the connection at once, a later good bind counts it again.
func TestFailedBindsDoNotCount(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 5, 2, &Auto{TargetPerNode: 10, CoolDown: time.Minute}, 12)
	real := arrive(t, p, "acme", 8, true, now)
	before := p.Conns()
	// 200 failing binds at once: all acquired before any answer.
	flood := make([]*Lease, 200)
	for i := range flood {
		l, err := p.Acquire("acme", now)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatal(err)
		}
		flood[i] = l
	}
	for _, l := range flood {
		if l != nil {
			l.Bound(false, now)
		}
	}
	if k := p.Explain("acme", now).Partitions; k != 2 || p.Counters().Grown != 0 {
		t.Fatalf("a flood of failed binds grew acme to %d", k)
	}
	if c := p.Conns(); !maps2Equal(c, before) || p.Counters().Unauthenticated != 200-int64(countNil(flood)) {
		t.Fatalf("failed binds still counted: %v, before %v, %+v", c, before, p.Counters())
	}
	// Capacity for real clients is what it was: 2 nodes × 12 − 8 = 16 more.
	own := Rank("acme", p.Nodes())[:2]
	for _, l := range arrive(t, p, "acme", 16, true, now) {
		if !slices.Contains(own, l.Node) {
			t.Fatalf("real client on %s: acme's nodes %v had no room left", l.Node, own)
		}
	}
	// A connection whose bind failed binds again with success: counted.
	flood[0].Bound(true, now)
	if p.Loads()["acme"].Authenticated != 8+16+1 {
		t.Fatalf("rebind with success not counted: %+v", p.Loads()["acme"])
	}
	for _, l := range append(real, flood...) {
		if l != nil {
			l.Release(now)
		}
	}
	if p.Counters().Unauthenticated != 0 {
		t.Fatalf("unauthenticated after release: %+v", p.Counters())
	}
}

func countNil(ls []*Lease) int {
	n := 0
	for _, l := range ls {
		if l == nil {
			n++
		}
	}
	return n
}

func maps2Equal(a, b map[string]int64) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// max_per_node: a full node takes no new connection while another of the
// tenant has room; with all full, the tenant grows if auto allows,
// otherwise ErrBusy (counted). Never past the ceiling.
func TestMaxPerNode(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 4, 2, nil, 3)
	arrive(t, p, "acme", 6, true, now)
	if _, err := p.Acquire("acme", now); !errors.Is(err, ErrBusy) || p.Counters().BusyRefusals != 1 {
		t.Fatalf("7th connection on 2 nodes of 3: %v", err)
	}
	if e := p.Explain("acme", now); e.Next != "" || !strings.Contains(e.Reason, "max_per_node") {
		t.Fatalf("explain at the ceiling: %+v", e)
	}
	for node, n := range p.Conns() {
		if n > 3 {
			t.Fatalf("%s holds %d over the ceiling", node, n)
		}
	}
	q := autoPlacer(t, 4, 2, &Auto{TargetPerNode: 100, Max: 3, CoolDown: time.Minute}, 3)
	arrive(t, q, "acme", 6, true, now)
	arrive(t, q, "acme", 3, true, now) // both nodes full, the load authenticated: grow
	if k := q.Explain("acme", now).Partitions; k != 3 || !strings.Contains(q.Loads()["acme"].Reason, "max_per_node") {
		t.Fatalf("full nodes did not grow acme: k %d, %+v", k, q.Loads()["acme"])
	}
	if _, err := q.Acquire("acme", now); !errors.Is(err, ErrBusy) {
		t.Fatalf("past max and ceilings: %v", err)
	}
}

// The tracked tenants are bounded: past MaxTrackedTenants a tenant is
// placed with its base count and counted on its node only.
func TestTrackedTenantsBounded(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 3, 1, &Auto{TargetPerNode: 1, CoolDown: time.Minute}, 0)
	for i := range MaxTrackedTenants {
		p.loads[fmt.Sprint("t", i)] = &load{auth: 1}
	}
	l, err := p.Acquire("late", now)
	if err != nil || l.state != leaseUntracked || len(p.loads) != MaxTrackedTenants {
		t.Fatalf("past the bound: %+v %v, %d tracked", l, err, len(p.loads))
	}
	l.Release(now)
	if p.Conns()[l.Node] != 0 {
		t.Fatal("untracked lease not released from its node")
	}
}

// A tally keeps the most recently counted names only.
func TestTallyIsBounded(t *testing.T) {
	ta := NewTally(3)
	for _, name := range []string{"a", "b", "a", "c", "d", "a"} {
		ta.Add(name)
	}
	if got := ta.Counts(); len(got) != 3 || got["a"] != 3 || got["b"] != 0 || got["d"] != 1 {
		t.Fatalf("tally %v", got)
	}
}

// Acquire, bind and Release, as each routed connection now does (with auto
// partitions on), beside BenchmarkReserveRelease (the choice alone).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, n := range []int{4, 64} {
		b.Run(fmt.Sprint(n, " nodes"), func(b *testing.B) {
			p, _ := New(3)
			p.SetNodes(nodes(n))
			p.SetLimits(&Auto{TargetPerNode: 1000, CoolDown: time.Minute}, 0)
			now := time.Now()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l, _ := p.Acquire("acme", now)
					l.Bound(true, now)
					l.Release(now)
				}
			})
		})
	}
}
