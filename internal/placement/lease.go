package placement

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Lease is one connection's place: its node, and whether it counts on that
// node and toward its tenant's load (its first bind unanswered, its bind
// succeeded, or a later bind admitted and not yet answered) or not (its
// bind failed). Every way into counting goes through the same check with
// the node's ceiling (Acquire for a new connection, Admit for a bind on a
// connection that does not count). Its methods are safe for concurrent use.
type Lease struct {
	p      *Placer
	Tenant string
	Node   string
	// word holds the lease's state (its low stateBits) and the binds
	// admitted and not yet answered (above them). The state changes only
	// under p.am; the binds in flight of a counted lease also change
	// without it (Admit, Bound on an authenticated lease), by CAS.
	word atomic.Int64
	// reqs is the tenant's request counter while the lease counts toward
	// its load (nil otherwise); set under p.am, read without it.
	reqs atomic.Pointer[atomic.Uint64]
}

const (
	stateBits = 3
	stateMask = 1<<stateBits - 1
	oneBind   = 1 << stateBits // one more bind in flight
)

// pack is a lease word: state, and binds in flight.
func pack(s leaseState, inflight int64) int64 { return inflight<<stateBits | int64(s) }

func unpack(w int64) (leaseState, int64) { return leaseState(w & stateMask), w >> stateBits }

// state is the lease's state now.
func (ls *Lease) state() leaseState { s, _ := unpack(ls.word.Load()); return s }

// counts reports whether a lease in state s is counted on its node.
func (s leaseState) counts() bool {
	return s == leasePending || s == leaseAuthenticated || s == leaseUntracked
}

// Requests counts n client messages on the lease's connection toward its
// tenant's request rate, if the connection counts as load (its bind
// succeeded or is unanswered). It takes no lock and allocates nothing: a
// relay calls it per read.
func (ls *Lease) Requests(n int) {
	if c := ls.reqs.Load(); c != nil && n > 0 {
		c.Add(uint64(n))
	}
}

type leaseState int8

const (
	leasePending         leaseState = iota // reserved, bind outcome unknown: counts
	leaseAuthenticated                     // counts
	leaseUnauthenticated                   // the bind failed: counts nowhere
	leaseReleased
	leaseUntracked // placed, but the tenant is past MaxTrackedTenants: counts on the node only
)

// Acquire chooses the node for a new connection of tenant and counts it
// there and in the tenant's load, in one step under the placer's load lock:
// auto partitions may first grow the tenant (see Auto); among the tenant's
// nodes not cooling off and below max_per_node it takes the one with the
// fewest connections. If all of them are at the ceiling, the tenant grows
// if Auto allows, otherwise ErrBusy. The caller must Release the lease.
func (p *Placer) Acquire(tenant string, now time.Time) (*Lease, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	ranked := Rank(tenant, p.nodes)
	base := p.partitions(tenant)
	l := p.loads[tenant]
	if l == nil && len(p.loads) < MaxTrackedTenants {
		l = &load{}
		p.loads[tenant] = l
	}
	k := base
	if l != nil {
		k = max(base, l.k)
		if p.auto != nil && k < p.maxK(len(ranked)) {
			if reason := p.over(l, k, len(ranked), 1); reason != "" {
				p.change(tenant, l, k, k+1, now, reason)
				k++
			}
		}
	}
	for {
		node, conns, full := p.choose(ranked, min(k, len(ranked)), now)
		// Full nodes grow a tenant only if its load is mostly authenticated:
		// a flood of binds that will fail fills slots for one round trip,
		// and must not buy the tenant more nodes.
		if node == "" && full > 0 && l != nil && p.auto != nil && k < p.maxK(len(ranked)) && l.pending <= l.auth {
			p.change(tenant, l, k, k+1, now, fmt.Sprintf("all %d nodes at max_per_node %d", k, p.maxPerNode))
			k++
			continue
		}
		if node == "" {
			p.forget(tenant, l)
			if full > 0 {
				p.busy.Add(1)
				return nil, ErrBusy
			}
			return nil, ErrNoNode
		}
		_ = conns
		p.conns[node].Add(1) // am serialises the choices; only releases run beside them
		ls := &Lease{p: p, Tenant: tenant, Node: node}
		// One bind in flight: the first message is taken to be a bind
		// until answered (Bound; a router without a bind to judge calls
		// Bound(true) at once).
		ls.word.Store(pack(leaseUntracked, 1))
		if l != nil {
			l.pending++
			ls.word.Store(pack(leasePending, 1))
			ls.reqs.Store(&l.requests)
		}
		return ls, nil
	}
}

// Admit is asked before each bind the client sends on the lease's
// connection after its first is forwarded to the node. A connection that
// counts (its bind succeeded, or one is in flight) passes at once, with no
// lock: pooled clients rebind on every use. One that does not (its last
// bind failed) is a connection coming back into the count, and meets the
// same check as a new one, atomically with the count (Acquire's rule):
// auto partitions see it as an arriving connection (a tenant above a
// growth threshold grows a step), and it is counted on its node, pending
// the bind's answer, unless the node is at max_per_node. A connection is
// never moved, so then the bind is refused with ErrBusy (the bind must
// not reach the node; the connection stays open and uncounted and may
// bind again later), after the tenant grows a step if all of its nodes
// are full and Auto allows, as for a new connection, so that new
// connections find room.
func (ls *Lease) Admit(now time.Time) error {
	for {
		w := ls.word.Load()
		s, _ := unpack(w)
		if s == leaseReleased {
			return nil // the connection is ending
		}
		if !s.counts() {
			return ls.p.readmit(ls, now)
		}
		if ls.word.CompareAndSwap(w, w+oneBind) {
			return nil
		}
	}
}

// readmit is Admit for a lease that does not count. It takes p.mu for
// writing: the node's count may have been forgotten (a removed node whose
// counted connections all closed).
func (p *Placer) readmit(ls *Lease, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.am.Lock()
	defer p.am.Unlock()
	if s, _ := unpack(ls.word.Load()); s != leaseUnauthenticated {
		if s.counts() {
			ls.word.Add(oneBind) // counted since the first look; the state cannot change under am
		}
		return nil
	}
	ranked := Rank(ls.Tenant, p.nodes)
	members := len(ranked)
	l := p.loads[ls.Tenant]
	if l == nil && len(p.loads) < MaxTrackedTenants {
		l = &load{}
		p.loads[ls.Tenant] = l
	}
	k := p.partitions(ls.Tenant)
	if l != nil {
		k = max(k, l.k)
		if p.auto != nil && k < p.maxK(members) {
			if reason := p.over(l, k, members, 1); reason != "" {
				p.change(ls.Tenant, l, k, k+1, now, reason)
				k++
			}
		}
	}
	c := p.conns[ls.Node]
	if c == nil {
		c = new(atomic.Int64)
		p.conns[ls.Node] = c
	}
	if p.maxPerNode > 0 && c.Load() >= p.maxPerNode {
		if l != nil && p.auto != nil && k < p.maxK(members) && l.pending <= l.auth {
			if next, _, full := p.choose(ranked, min(k, members), now); next == "" && full > 0 {
				p.change(ls.Tenant, l, k, k+1, now, fmt.Sprintf("all %d nodes at max_per_node %d", k, p.maxPerNode))
			}
		}
		p.forget(ls.Tenant, l)
		p.busy.Add(1)
		return ErrBusy
	}
	c.Add(1)
	p.unauth.Add(-1)
	if l == nil {
		ls.word.Store(pack(leaseUntracked, 1))
		return nil
	}
	l.pending++
	ls.reqs.Store(&l.requests)
	ls.word.Store(pack(leasePending, 1))
	return nil
}

// Bound records the answer to a bind on the lease's connection (its first,
// or one Admit let through). A failed bind leaves the connection
// unauthenticated (RFC 4511 4.2.1): once no other admitted bind is in
// flight, it stops counting toward its node and its tenant's load, so
// naming a tenant with a wrong password neither grows it nor fills its
// nodes. A successful bind counts it as authenticated; only Admit brings a
// connection that stopped counting back into the count, so a success on a
// lease that does not count (a bind it never admitted) changes nothing. A
// success on an authenticated lease takes no lock.
func (ls *Lease) Bound(ok bool, now time.Time) {
	if ok {
		for {
			w := ls.word.Load()
			s, n := unpack(w)
			if s == leasePending {
				break
			}
			if n == 0 || ls.word.CompareAndSwap(w, w-oneBind) {
				return
			}
		}
	}
	p := ls.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	l := p.loads[ls.Tenant]
	for {
		w := ls.word.Load()
		s, n := unpack(w)
		n = max(n-1, 0)
		to := s
		switch {
		case s == leaseUntracked || s == leaseReleased || s == leaseUnauthenticated:
			// untracked: counted on its node only, whatever the binds say;
			// unauthenticated: not counted, and only Admit counts it again
		case ok:
			to = leaseAuthenticated
		case n > 0:
			to = leasePending // another admitted bind is in flight: still counted
		default:
			to = leaseUnauthenticated
		}
		if !ls.word.CompareAndSwap(w, pack(to, n)) {
			continue // a bind admitted meanwhile (Admit's lock-free path)
		}
		if to == s {
			return
		}
		switch s {
		case leasePending:
			l.pending--
		case leaseAuthenticated:
			l.auth--
		}
		switch to {
		case leasePending:
			l.pending++
		case leaseAuthenticated:
			l.auth++
		case leaseUnauthenticated:
			p.count(ls.Node, -1)
			p.unauth.Add(1)
			ls.reqs.Store(nil)
			p.settle(ls.Tenant, l, now, p.allConns())
		}
		return
	}
}

// BindInProgress records an answer that ends no bind (a SASL step, result
// 14): the admitted bind is answered, the connection stays as it was (a
// pending one counted until the exchange ends). It takes no lock.
func (ls *Lease) BindInProgress() {
	for {
		w := ls.word.Load()
		if _, n := unpack(w); n == 0 || ls.word.CompareAndSwap(w, w-oneBind) {
			return
		}
	}
}

// Release ends the lease: its connection closed, or could not be made.
func (ls *Lease) Release(now time.Time) {
	p := ls.p
	p.am.Lock()
	state, _ := unpack(ls.word.Swap(pack(leaseReleased, 0)))
	ls.reqs.Store(nil)
	if l := p.loads[ls.Tenant]; l != nil {
		switch state {
		case leasePending:
			l.pending--
		case leaseAuthenticated:
			l.auth--
		}
	}
	if state == leaseUnauthenticated {
		p.unauth.Add(-1)
	}
	p.am.Unlock()
	if state.counts() {
		p.Release(ls.Node) // takes p.mu; may forget a removed node
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	if l := p.loads[ls.Tenant]; l != nil {
		p.settle(ls.Tenant, l, now, p.allConns())
	}
}

// count adds d to node's connections, if it is known; p.mu is held.
func (p *Placer) count(node string, d int64) {
	if c := p.conns[node]; c != nil {
		c.Add(d)
	}
}
