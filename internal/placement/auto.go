package placement

import (
	"errors"
	"fmt"
	"time"
)

// Auto makes a tenant's partition count follow its load: the seed's open
// "hot tenant" problem. A tenant's load is its connections that count:
// authenticated ones, plus those whose bind is still unanswered up to as
// many as are authenticated (so a burst of a busy tenant spreads at once,
// while binds that were never answered with success cannot grow a tenant
// that has no authenticated load).
//
// The rule, with T = TargetPerNode, k the tenant's count now and base its
// count without Auto:
//   - grow: a connection arriving while load > T·k gives k+1 (up to Max and
//     the members), one step per arrival; the new node is the next in
//     rendezvous order, so only this tenant's placement changes and its
//     connections stay where they are;
//   - shrink: load below T·k/2 without a break for CoolDown gives k−1
//     (down to base), and another CoolDown must pass for each further step;
//     the dropped node takes no new connection of the tenant and drains;
//   - in between nothing changes. Just after growing, load is about T·k,
//     above T·(k+1)/2; just after shrinking, load is below T·k/2, at most
//     T·(k−1) for k ≥ 2: neither step can undo the other at once, so a load
//     that oscillates around one threshold changes k once, not every swing.
//
// With a per-node ceiling (max_per_node), a tenant all of whose nodes are
// full also grows one step (if Max allows, and if no more of its
// connections are unanswered than authenticated), else the connection is
// refused with ErrBusy.
type Auto struct {
	TargetPerNode int           // connections per node above which a tenant grows
	Max           int           // most partitions a tenant is grown to (0: every member)
	CoolDown      time.Duration // below half the target this long: shrink one step
}

// load is one tenant's counted connections and its grown partition count.
// A tenant has an entry while it has connections or a count above its
// base; the entries are bounded by MaxTrackedTenants.
type load struct {
	auth, pending int
	k             int       // partitions now; 0: base
	below         time.Time // load below half the target since; zero: not below
	changed       time.Time // last change of k
	reason        string
	grew          bool // the last change grew k
}

// MaxTrackedTenants bounds the tenants whose load is tracked: names come
// from clients. A tenant past the bound is placed with its base count.
const MaxTrackedTenants = 100_000

// ErrBusy: every node of the tenant is at max_per_node and its partitions
// may not grow. The connection is refused (LDAP busy, result code 51).
var ErrBusy = errors.New("every node of the tenant is at max_per_node")

// ErrNoNode: no member can take a connection (none, or all cooling off).
var ErrNoNode = errors.New("no node")

// SetLimits applies a config generation's auto partitions (nil: off) and
// per-node ceiling (0: none). Grown counts are kept; with auto off they are
// forgotten, and a lower Max takes effect at each tenant's next change.
func (p *Placer) SetLimits(auto *Auto, maxPerNode int) error {
	if auto != nil && (auto.TargetPerNode < 1 || auto.Max < 0 || auto.CoolDown <= 0) {
		return errors.New("auto partitions need target_per_node ≥ 1, max ≥ 0 and a positive cool_down")
	}
	if maxPerNode < 0 {
		return errors.New("max_per_node must not be negative")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.am.Lock()
	defer p.am.Unlock()
	if auto != nil {
		a := *auto
		auto = &a
	} else {
		for _, l := range p.loads {
			l.k = 0
		}
	}
	p.auto, p.maxPerNode = auto, int64(maxPerNode)
	return nil
}

// Lease is one connection's place: its node, and whether it counts toward
// its tenant's load (authenticated, or its bind not yet answered) or not
// (its bind failed). Its methods are safe for concurrent use.
type Lease struct {
	p      *Placer
	Tenant string
	Node   string
	state  leaseState
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
		if a := p.auto; a != nil && l.effective(1) > a.TargetPerNode*k && k < p.maxK(len(ranked)) {
			k++
			p.change(l, k, now, true, fmt.Sprintf("%d connections over %d nodes: above target_per_node %d",
				l.effective(1), k-1, a.TargetPerNode))
		}
	}
	for {
		node, conns, full := p.choose(ranked, min(k, len(ranked)), now)
		// Full nodes grow a tenant only if its load is mostly authenticated:
		// a flood of binds that will fail fills slots for one round trip,
		// and must not buy the tenant more nodes.
		if node == "" && full > 0 && l != nil && p.auto != nil && k < p.maxK(len(ranked)) && l.pending <= l.auth {
			k++
			p.change(l, k, now, true, fmt.Sprintf("all %d nodes at max_per_node %d", k-1, p.maxPerNode))
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
		ls := &Lease{p: p, Tenant: tenant, Node: node, state: leaseUntracked}
		if l != nil {
			l.pending++
			ls.state = leasePending
		}
		return ls, nil
	}
}

// maxK is the most partitions Auto gives a tenant among members nodes.
func (p *Placer) maxK(members int) int {
	if p.auto == nil || p.auto.Max == 0 {
		return members
	}
	return min(p.auto.Max, members)
}

// effective is the tenant's load with arriving more connections pending.
func (l *load) effective(arriving int) int {
	return l.auth + min(l.pending+arriving, l.auth)
}

// change sets l's count; p.am is held.
func (p *Placer) change(l *load, k int, now time.Time, grew bool, reason string) {
	l.k, l.changed, l.reason, l.grew, l.below = k, now, reason, grew, time.Time{}
	if grew {
		p.changes[0].Add(1)
	} else {
		p.changes[1].Add(1)
	}
}

// forget drops an idle tenant's entry at its base count; p.am is held.
func (p *Placer) forget(tenant string, l *load) {
	if l != nil && l.auth == 0 && l.pending == 0 && l.k <= p.partitions(tenant) {
		delete(p.loads, tenant)
	}
}

// settle applies the shrink rule to one tenant at now and reports whether
// it shrank; p.mu (read) and p.am are held.
func (p *Placer) settle(tenant string, l *load, now time.Time) (shrunk bool) {
	base := p.partitions(tenant)
	a := p.auto
	if a == nil || l.k <= base {
		l.below = time.Time{}
		p.forget(tenant, l)
		return false
	}
	if 2*l.effective(0) >= a.TargetPerNode*l.k {
		l.below = time.Time{}
		return false
	}
	if l.below.IsZero() {
		l.below = now
		return false
	}
	if shrunk = now.Sub(l.below) >= a.CoolDown; shrunk {
		p.change(l, l.k-1, now, false, fmt.Sprintf("%d connections over %d nodes: below half of target_per_node %d for cool_down %v",
			l.effective(0), l.k, a.TargetPerNode, a.CoolDown))
		if l.k > base && 2*l.effective(0) < a.TargetPerNode*l.k {
			l.below = now // the next step needs another cool_down
		}
	}
	p.forget(tenant, l)
	return shrunk
}

// Tick applies the shrink rule to every tracked tenant: a router calls it
// every second or so, so a tenant with no arrivals or departures shrinks
// when its cool-down ends.
func (p *Placer) Tick(now time.Time) (shrunk []string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	for tenant, l := range p.loads {
		if p.settle(tenant, l, now) {
			shrunk = append(shrunk, tenant)
		}
	}
	return shrunk
}

// Bound records the outcome of a bind on the lease's connection. A failed
// bind leaves the connection unauthenticated (RFC 4511 4.2.1): it stops
// counting toward its node and its tenant's load, so naming a tenant with
// a wrong password neither grows it nor fills its nodes. A later successful
// bind counts it again, on the node it is on.
func (ls *Lease) Bound(ok bool, now time.Time) {
	p := ls.p
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	l := p.loads[ls.Tenant]
	switch {
	case ls.state == leaseUntracked || ls.state == leaseReleased:
		return
	case ok && ls.state == leasePending:
		l.pending--
		l.auth++
	case ok && ls.state == leaseUnauthenticated:
		p.unauth.Add(-1)
		p.count(ls.Node, 1)
		if l == nil {
			if len(p.loads) >= MaxTrackedTenants {
				ls.state = leaseUntracked
				return
			}
			l = &load{}
			p.loads[ls.Tenant] = l
		}
		l.auth++
	case !ok && ls.state == leasePending:
		l.pending--
		p.count(ls.Node, -1)
		p.unauth.Add(1)
	case !ok && ls.state == leaseAuthenticated:
		l.auth--
		p.count(ls.Node, -1)
		p.unauth.Add(1)
	default:
		return // no change
	}
	if ok {
		ls.state = leaseAuthenticated
	} else {
		ls.state = leaseUnauthenticated
		p.settle(ls.Tenant, l, now)
	}
}

// Release ends the lease: its connection closed, or could not be made.
func (ls *Lease) Release(now time.Time) {
	p := ls.p
	p.am.Lock()
	state := ls.state
	ls.state = leaseReleased
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
	if state == leasePending || state == leaseAuthenticated || state == leaseUntracked {
		p.Release(ls.Node) // takes p.mu; may forget a removed node
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	if l := p.loads[ls.Tenant]; l != nil {
		p.settle(ls.Tenant, l, now)
	}
}

// count adds d to node's connections, if it is known; p.mu is held.
func (p *Placer) count(node string, d int64) {
	if c := p.conns[node]; c != nil {
		c.Add(d)
	}
}

// TenantLoad is a tracked tenant's load and partitions, for the admin view.
type TenantLoad struct {
	Authenticated int       // connections whose bind succeeded
	Pending       int       // connections whose first bind is unanswered
	Partitions    int       // k now (auto may have grown it)
	Changed       time.Time // last change by Auto; zero: none
	Reason        string    // why
	Grew          bool      // the last change grew k
}

// Loads returns the tracked tenants' loads (at most MaxTrackedTenants).
func (p *Placer) Loads() map[string]TenantLoad {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	out := make(map[string]TenantLoad, len(p.loads))
	for tenant, l := range p.loads {
		out[tenant] = TenantLoad{Authenticated: l.auth, Pending: l.pending, Partitions: max(l.k, p.partitions(tenant)),
			Changed: l.changed, Reason: l.reason, Grew: l.grew}
	}
	return out
}

// Grown returns the tenants whose count Auto raised above their base, with
// that count.
func (p *Placer) Grown() map[string]int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	out := map[string]int{}
	for tenant, l := range p.loads {
		if l.k > p.partitions(tenant) {
			out[tenant] = l.k
		}
	}
	return out
}

// Counters are the placer's running totals.
type Counters struct {
	Grown, Shrunk   uint64 // partition changes by Auto
	BusyRefusals    uint64 // connections refused: every node at max_per_node
	Unauthenticated int64  // connections open whose bind failed (not counted on nodes)
}

// Counters returns the running totals.
func (p *Placer) Counters() Counters {
	return Counters{Grown: p.changes[0].Load(), Shrunk: p.changes[1].Load(), BusyRefusals: p.busy.Load(),
		Unauthenticated: p.unauth.Load()}
}

// AutoConfig returns the auto partitions in force (nil: off) and the
// per-node ceiling (0: none).
func (p *Placer) AutoConfig() (*Auto, int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.auto == nil {
		return nil, int(p.maxPerNode)
	}
	a := *p.auto
	return &a, int(p.maxPerNode)
}
