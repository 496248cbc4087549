package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// The binds a client sends on a connection, as the fuzz drives them.
const (
	bindRight     = iota // the tenant's user with its password: the node answers success
	bindWrong            // a wrong password: the node answers invalidCredentials
	bindAnonymous        // an empty DN: with the DN rule, the router closes the connection (no tenant);
	//                      with a tenant from a placeholder, it is a bind like any other, answered success
	bindOther // another tenant's DN: the router closes the connection (tenant isolation)
	bindKinds
)

// modelConn is one client connection as the test expects the router to
// count it.
type modelConn struct {
	lease    *Lease
	tenant   string
	counted  bool   // on its node, in the count
	inflight []bool // binds admitted, not yet answered: their outcome (true: success)
}

// bindSequences runs one random sequence of connections and binds,
// encoded in ops, against a placer with a small ceiling and auto partitions,
// and checks after every step that each node's count is the number of
// connections counted on it (a first bind unanswered, a bind that
// succeeded, or an admitted bind in flight) and at most max_per_node; that
// a refused bind came only with its node at the ceiling; and that the
// unauthenticated and per-tenant loads add up.
func bindSequences(t *testing.T, ops []byte) {
	if len(ops) == 0 {
		return
	}
	const ceiling = 3
	placeholder := ops[0]&1 == 1 // anonymous binds are binds, not refused rebinds
	p, _ := New(2)
	p.SetNodes(nodes(5))
	if err := p.SetLimits(&Auto{TargetPerNode: 2, Max: 3, CoolDown: time.Second}, ceiling); err != nil {
		t.Fatal(err)
	}
	tenants := []string{"acme", "globex", "initech"}
	now := time.Unix(1_000_000, 0)
	var conns []*modelConn
	outcome := func(kind byte) bool { return kind == bindRight || kind == bindAnonymous }
	closeConn := func(i int) {
		conns[i].lease.Release(now)
		conns = append(conns[:i], conns[i+1:]...)
	}
	check := func(step int, what string) {
		t.Helper()
		want := map[string]int64{}
		load := map[string]int{}
		var unauth int64
		for _, c := range conns {
			if c.counted {
				want[c.lease.Node]++
				load[c.tenant]++
			} else {
				unauth++
			}
		}
		got := p.Conns()
		for _, n := range nodes(5) {
			if got[n] != want[n] || got[n] > ceiling {
				t.Fatalf("step %d (%s): node %s counts %d, connections counted on it %d (ceiling %d); all %v",
					step, what, n, got[n], want[n], ceiling, got)
			}
		}
		if u := p.Counters().Unauthenticated; u != unauth {
			t.Fatalf("step %d (%s): unauthenticated %d, want %d", step, what, u, unauth)
		}
		for tenant, l := range p.Loads() {
			if l.Authenticated+l.Pending != load[tenant] {
				t.Fatalf("step %d (%s): %s load %+v, want %d counted", step, what, tenant, l, load[tenant])
			}
		}
	}
	for step := 1; step+1 < len(ops); step += 2 {
		op, arg := ops[step], int(ops[step+1])
		var what string
		switch {
		case op%8 < 2 || len(conns) == 0: // a new connection, its first bind sent
			tenant := tenants[arg%len(tenants)]
			kind := byte(arg/len(tenants)) % bindKinds
			if kind == bindOther || kind == bindAnonymous && !placeholder {
				kind = bindRight // a first bind names the tenant it is routed by
			}
			what = fmt.Sprintf("new connection of %s, first bind %d", tenant, kind)
			ls, err := p.Acquire(tenant, now)
			if errors.Is(err, ErrBusy) || errors.Is(err, ErrNoNode) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, &modelConn{lease: ls, tenant: tenant, counted: true, inflight: []bool{outcome(kind)}})
		case op%8 < 5: // a bind on an open connection
			c := conns[arg%len(conns)]
			kind := byte(op/8) % bindKinds
			what = fmt.Sprintf("bind %d on a connection of %s on %s", kind, c.tenant, c.lease.Node)
			if kind == bindOther || kind == bindAnonymous && !placeholder {
				closeConn(arg % len(conns)) // the guard refuses it: the connection is closed
				break
			}
			before := p.Conns()[c.lease.Node]
			err := c.lease.Admit(now)
			switch {
			case errors.Is(err, ErrBusy):
				if c.counted || before < ceiling {
					t.Fatalf("step %d (%s): refused busy with its node at %d, counted %v", step, what, before, c.counted)
				}
			case err != nil:
				t.Fatal(err)
			default:
				if !c.counted && before >= ceiling {
					t.Fatalf("step %d (%s): admitted with its node at %d", step, what, before)
				}
				c.counted = true
				c.inflight = append(c.inflight, outcome(kind))
			}
		case op%8 < 7: // the node answers a connection's oldest bind in flight
			c := conns[arg%len(conns)]
			what = fmt.Sprintf("answer on a connection of %s", c.tenant)
			if len(c.inflight) == 0 {
				break
			}
			ok := c.inflight[0]
			c.inflight = c.inflight[1:]
			c.lease.Bound(ok, now)
			if !ok && len(c.inflight) == 0 {
				c.counted = false
			}
		default: // a connection closes, or time passes
			if arg%2 == 0 {
				what = "close"
				closeConn(arg / 2 % len(conns))
			} else {
				what = "tick"
				now = now.Add(700 * time.Millisecond)
				p.Tick(now)
			}
		}
		check(step, what)
	}
	for len(conns) > 0 {
		closeConn(0)
	}
	check(len(ops), "all closed")
}

// Random bind sequences on many connections (seeded, so a failure is
// reproducible): every step keeps each node's count equal to the
// connections counted on it, and at most the ceiling.
func TestRandomBindSequences(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 33))
		ops := make([]byte, 600)
		for i := range ops {
			ops[i] = byte(r.Uint32())
		}
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { bindSequences(t, ops) })
	}
}

// FuzzBindSequences is the same check over inputs the fuzzer finds
// (go test -fuzz FuzzBindSequences ./internal/placement/).
func FuzzBindSequences(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 3, 2, 0, 5, 0, 2, 2, 5, 1, 2, 0, 5, 0, 2, 0, 10, 0, 2, 0, 2, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 2, 10, 0, 5, 1, 2, 1, 5, 0, 7, 1, 0, 3, 3, 0})
	r := rand.New(rand.NewPCG(1, 2))
	seed := make([]byte, 300)
	for i := range seed {
		seed[i] = byte(r.Uint32())
	}
	f.Add(seed)
	f.Fuzz(bindSequences)
}

// Concurrent binds on full nodes: connections whose first bind failed bind
// again, all at once, while others close and reopen; a sampler reads the
// counts throughout. No sample passes the ceiling, and at the end each
// node counts exactly the connections bound on it.
func TestRebindsMeetTheCeilingConcurrently(t *testing.T) {
	const ceiling = 10
	now := time.Now()
	p := autoPlacer(t, 4, 2, &Auto{TargetPerNode: 1000, Max: 2, CoolDown: time.Minute}, ceiling)
	failed := make([]*Lease, 30)
	for i := range failed {
		l, err := p.Acquire("acme", now)
		if err != nil {
			t.Fatal(err)
		}
		failed[i] = l
		l.Bound(false, now)
	}
	held := arrive(t, p, "acme", 2*ceiling, true, now) // acme's two nodes full
	// Free three places where rebinds wait and two elsewhere when it can:
	// which node each arrival got depends on scheduling, and five frees on
	// a node with no rebind waiting would test nothing.
	waitsOn := map[string]bool{}
	for _, l := range failed {
		waitsOn[l.Node] = true
	}
	slices.SortStableFunc(held, func(a, b *Lease) int {
		if waitsOn[a.Node] == waitsOn[b.Node] {
			return 0
		}
		if waitsOn[a.Node] {
			return -1
		}
		return 1
	})
	held[3], held[len(held)-1] = held[len(held)-1], held[3]
	held[4], held[len(held)-2] = held[len(held)-2], held[4]
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	var over string
	go func() {
		defer sampled.Done()
		for {
			for n, c := range p.Conns() {
				if c > ceiling && over == "" {
					over = fmt.Sprintf("%s at %d", n, c)
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	var wg, releases sync.WaitGroup
	released := make(chan struct{})
	bound := make([]bool, len(failed))
	for i, l := range failed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bind again until the room has freed up, then once more:
			// the last try sees every release whatever the scheduling.
			for last := false; ; {
				if err := l.Admit(now); err == nil {
					bound[i] = true
					l.Bound(true, now)
					return
				}
				if last {
					return
				}
				select {
				case <-released:
					last = true
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	for _, l := range held[:5] { // room frees up while they try
		releases.Add(1)
		go func() {
			defer releases.Done()
			l.Release(now)
		}()
	}
	releases.Wait()
	close(released)
	wg.Wait()
	close(stop)
	sampled.Wait()
	if over != "" {
		t.Fatalf("a sample passed the ceiling: %s", over)
	}
	want := map[string]int64{}
	for _, l := range held[5:] {
		want[l.Node]++
	}
	admitted := 0
	for i, l := range failed {
		if bound[i] {
			want[l.Node]++
			admitted++
		}
	}
	// Each freed place goes to one rebind on its node, while any wait there.
	freed, waiting, room := map[string]int{}, map[string]int{}, 0
	for _, l := range held[:5] {
		freed[l.Node]++
	}
	for _, l := range failed {
		waiting[l.Node]++
	}
	for n, f := range freed {
		room += min(f, waiting[n])
	}
	if got := p.Conns(); !maps2Equal(got, want) || admitted != room || room == 0 {
		t.Fatalf("counts %v, want %v (%d rebinds admitted, %d places for them)", got, want, admitted, room)
	}
}
