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
	// A connection whose bind failed binds again: its node is full, so the
	// bind is refused (and acme, all of whose nodes are full, grows a step
	// for new connections); once a slot frees on its node, the bind is
	// admitted and, answered with success, counted.
	again := flood[0]
	full := p.Conns()
	if err := again.Admit(now); !errors.Is(err, ErrBusy) || !maps2Equal(p.Conns(), full) {
		t.Fatalf("rebind on a full node: %v, counts %v (were %v)", err, p.Conns(), full)
	}
	if k := p.Explain("acme", now).Partitions; k != 3 {
		t.Fatalf("acme's nodes all full at a rebind: k %d, want a step to 3", k)
	}
	var gone *Lease
	for i, l := range real {
		if l.Node == again.Node {
			gone, real = l, slices.Delete(real, i, i+1)
			break
		}
	}
	gone.Release(now)
	if err := again.Admit(now); err != nil {
		t.Fatalf("rebind with room on its node: %v", err)
	}
	again.Bound(true, now)
	if p.Loads()["acme"].Authenticated != 8+16 || p.Conns()[again.Node] != 12 {
		t.Fatalf("rebind with success not counted: %+v, %v", p.Loads()["acme"], p.Conns())
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
	if err != nil || l.state() != leaseUntracked || len(p.loads) != MaxTrackedTenants {
		t.Fatalf("past the bound: %+v %v, %d tracked", l, err, len(p.loads))
	}
	l.Release(now)
	if p.Conns()[l.Node] != 0 {
		t.Fatal("untracked lease not released from its node")
	}
}

// Acquire, bind and Release, as each routed connection does (with auto
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

// steady opens n connections for each of count tenants other-0…, bound.
func steady(t *testing.T, p *Placer, count, n int, now time.Time) []*Lease {
	t.Helper()
	var out []*Lease
	for i := range count { // in two waves: the second sees the first's load
		out = append(out, arrive(t, p, fmt.Sprint("other-", i), n/2, true, now)...)
		out = append(out, arrive(t, p, fmt.Sprint("other-", i), n-n/2, true, now)...)
	}
	return out
}

// The share trigger: with share_factor 2 over 8 nodes, a tenant of k = 2
// grows once its share of all connections exceeds 2 × 2/8 = 50 %; with 60
// connections of others that is its 61st. Others (each 10 %) never grow,
// not even the first to arrive on an empty router.
func TestAutoShareFactorGrows(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 8, 2, &Auto{ShareFactor: 2, CoolDown: time.Minute}, 0)
	others := steady(t, p, 10, 6, now)
	placed := map[string][]string{}
	for i := range 10 {
		placed[fmt.Sprint("other-", i)] = p.Place(fmt.Sprint("other-", i))
	}
	if g := p.Grown(); len(g) != 0 {
		t.Fatalf("steady tenants grew: %v", g)
	}
	held := arrive(t, p, "acme", 60, true, now) // 60 of 120: not above 50 %
	if k := p.Explain("acme", now).Partitions; k != 2 {
		t.Fatalf("k = %d at a 50 %% share", k)
	}
	held = append(held, arrive(t, p, "acme", 1, true, now)...) // 61 of 121
	if k := p.Explain("acme", now).Partitions; k != 3 {
		t.Fatalf("k = %d at 61 of 121", k)
	}
	if r := p.Loads()["acme"].Reason; !strings.Contains(r, "share_factor 2") || !strings.Contains(r, "61 of 121") {
		t.Fatalf("reason %q", r)
	}
	// k = 3 grows above 2 × 3/8 = 75 %: 181 of 241.
	held = append(held, arrive(t, p, "acme", 119, true, now)...)
	if k := p.Explain("acme", now).Partitions; k != 3 {
		t.Fatalf("k = %d at 180 of 240", k)
	}
	held = append(held, arrive(t, p, "acme", 1, true, now)...)
	if k := p.Explain("acme", now).Partitions; k != 4 {
		t.Fatalf("k = %d at 181 of 241", k)
	}
	for tenant, nodes := range placed {
		if !slices.Equal(p.Place(tenant), nodes) {
			t.Fatalf("%s moved: %v → %v", tenant, nodes, p.Place(tenant))
		}
	}
	if g := p.Grown(); len(g) != 1 {
		t.Fatalf("grown: %v", g)
	}
	_, _ = others, held
}

// Hysteresis of the share trigger, with a load that oscillates around the
// growth threshold (56 ↔ 64 of the tenant against 60 of others, threshold
// 50 %) and then around the shrink threshold of k = 3 (half of 75 %:
// below 36 of the tenant against 60), each dip shorter than cool_down:
// k changes once. Below it for a whole cool_down, k shrinks one step.
func TestAutoShareHysteresis(t *testing.T) {
	now := time.Now()
	cool := 10 * time.Second
	p := autoPlacer(t, 8, 2, &Auto{ShareFactor: 2, CoolDown: cool}, 0)
	steady(t, p, 10, 6, now)
	held := arrive(t, p, "acme", 56, true, now)
	swing := func(up int) {
		now = now.Add(time.Second)
		held = append(held, arrive(t, p, "acme", up, true, now)...)
		p.Tick(now)
		now = now.Add(time.Second)
		for _, l := range held[len(held)-up:] {
			l.Release(now)
		}
		held = held[:len(held)-up]
		p.Tick(now)
	}
	for i := range 20 { // 56 ↔ 64
		swing(8)
		if k := p.Explain("acme", now).Partitions; k != 3 {
			t.Fatalf("swing %d: k = %d, want 3 (grown once)", i, k)
		}
	}
	for _, l := range held[:22] {
		l.Release(now)
	}
	held = held[22:]    // 34: 34/94 = 36 % < 37.5 %
	for i := range 10 { // 34 ↔ 38 (38/98 = 39 %), each dip cool/2 long
		now = now.Add(cool / 2)
		p.Tick(now)
		swing(4)
		if k := p.Explain("acme", now).Partitions; k != 3 {
			t.Fatalf("swing %d around the shrink threshold: k = %d", i, k)
		}
	}
	if c := p.Counters(); c.Grown != 1 || c.Shrunk != 0 {
		t.Fatalf("changes %+v, want 1 growth", c)
	}
	p.Tick(now.Add(time.Second))
	p.Tick(now.Add(cool + 2*time.Second))
	if k := p.Explain("acme", now).Partitions; k != 2 {
		t.Fatalf("k = %d after a whole cool_down below half the share threshold", k)
	}
	if r := p.Loads()["acme"].Reason; !strings.Contains(r, "below half of share_factor 2") {
		t.Fatalf("reason %q", r)
	}
}

// The request-rate trigger: with target_requests_per_node 100, a tenant
// of k = 2 and 4 connections grows when a rate window ends above 200
// messages per second, one step per window; a rate oscillating around the
// threshold (180 ↔ 220) grows it once; its connections do not move; a
// rate below half the threshold of k = 3 (150) for cool_down shrinks it.
// Messages on a connection whose bind failed, or after it closed, do not
// count.
func TestAutoRequestRate(t *testing.T) {
	now := time.Now()
	cool := 5 * time.Second
	p := autoPlacer(t, 6, 2, &Auto{TargetRequestsPerNode: 100, CoolDown: cool}, 0)
	held := arrive(t, p, "acme", 4, true, now)
	failed := arrive(t, p, "acme", 1, false, now)[0]
	gone := arrive(t, p, "acme", 1, true, now)[0]
	gone.Release(now)
	where := map[*Lease]string{}
	for _, l := range held {
		where[l] = l.Node
	}
	p.Tick(now) // opens the first window
	window := func(rate int) {
		for i := range rate {
			held[i%len(held)].Requests(1)
			failed.Requests(5)
			gone.Requests(5)
		}
		now = now.Add(RateWindow / 2)
		p.Tick(now)
		now = now.Add(RateWindow / 2)
		p.Tick(now)
	}
	window(200) // not above 200
	if l := p.Loads()["acme"]; l.Partitions != 2 || l.RequestsPerSecond != 200 {
		t.Fatalf("at 200/s: %+v", l)
	}
	for i := range 10 {
		window([]int{220, 180}[i%2])
		if k := p.Explain("acme", now).Partitions; k != 3 {
			t.Fatalf("window %d: k = %d, want 3", i, k)
		}
	}
	if r := p.Loads()["acme"].Reason; !strings.Contains(r, "220 requests per second over 2 nodes: above target_requests_per_node 100") {
		t.Fatalf("reason %q", r)
	}
	window(700) // above 300: one step per window, not to 700/100
	if k := p.Explain("acme", now).Partitions; k != 4 {
		t.Fatalf("k = %d after one window at 700/s", k)
	}
	window(700) // above 400
	window(700) // above 500
	window(700) // 6 members: stays 6
	if k := p.Explain("acme", now).Partitions; k != 6 {
		t.Fatalf("k = %d after windows at 700/s", k)
	}
	for l, node := range where {
		if l.Node != node {
			t.Fatalf("a connection moved")
		}
	}
	// Below half of 100 × 6 for cool_down: one step; the next needs another.
	for range int(cool/RateWindow) + 1 {
		window(100)
	}
	if k := p.Explain("acme", now).Partitions; k != 5 {
		t.Fatalf("k = %d after a cool_down at 100/s", k)
	}
	if c := p.Counters(); c.Grown != 4 || c.Shrunk != 1 {
		t.Fatalf("changes %+v", c)
	}
}

// Requests counts without a lock or an allocation.
func TestRequestsAllocatesNothing(t *testing.T) {
	p := autoPlacer(t, 3, 2, &Auto{TargetRequestsPerNode: 10, CoolDown: time.Second}, 0)
	l := arrive(t, p, "acme", 1, true, time.Now())[0]
	if n := testing.AllocsPerRun(1, func() { // one run of 1000: the exact count, not a rounded average
		for range 1000 {
			l.Requests(3)
		}
	}); n != 0 {
		t.Fatalf("%v allocations in 1000 calls", n)
	}
}

// A shrink needs every configured signal below half its threshold: many
// requests keep a tenant grown by connections.
func TestAutoShrinkNeedsEverySignalLow(t *testing.T) {
	now := time.Now()
	cool := 2 * time.Second
	p := autoPlacer(t, 6, 2, &Auto{TargetPerNode: 5, TargetRequestsPerNode: 100, CoolDown: cool}, 0)
	held := arrive(t, p, "acme", 10, true, now)
	held = append(held, arrive(t, p, "acme", 1, true, now)...) // > 10: k = 3
	if k := p.Explain("acme", now).Partitions; k != 3 {
		t.Fatalf("k = %d", k)
	}
	for _, l := range held[2:] {
		l.Release(now) // 2 connections: below half of 15
	}
	held = held[:2]
	p.Tick(now)
	for range 6 { // 250/s: below 300, above half of it
		for range 250 {
			held[0].Requests(1)
		}
		now = now.Add(RateWindow)
		p.Tick(now)
	}
	if k := p.Explain("acme", now).Partitions; k != 3 {
		t.Fatalf("k = %d with the rate above half its threshold", k)
	}
	for range 4 { // no requests
		now = now.Add(RateWindow)
		p.Tick(now)
	}
	if k := p.Explain("acme", now).Partitions; k != 2 {
		t.Fatalf("k = %d with both signals low for cool_down", k)
	}
}

// Requests runs beside binds, releases and ticks (go test -race): every
// message counted while its lease counted is in the rate, none after.
func TestRequestsConcurrent(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 4, 2, &Auto{TargetRequestsPerNode: 1e9, CoolDown: time.Minute}, 0)
	keep := arrive(t, p, "acme", 1, true, now)[0] // keeps the tenant tracked
	p.Tick(now)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				l, err := p.Acquire("acme", now)
				if err != nil {
					t.Error(err)
					return
				}
				l.Bound(true, now)
				l.Requests(2)
				l.Release(now)
				l.Requests(1000) // after release: not counted
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 100 {
			p.Tick(now)
			keep.Requests(1)
		}
	}()
	wg.Wait()
	p.Tick(now.Add(RateWindow))
	if got := p.Loads()["acme"].RequestsPerSecond; got != 8*50*2+100 {
		t.Fatalf("%v requests per second, want %d", got, 8*50*2+100)
	}
}
