package placement

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Auto makes a tenant's partition count follow its load, so that a tenant
// with far more traffic than the rest does not make its few nodes hot
// (placement by partition counts does not see load). A tenant's load is its connections that count:
// authenticated ones, plus those whose bind is still unanswered up to as
// many as are authenticated (so a burst of a busy tenant spreads at once,
// while binds that were never answered with success cannot grow a tenant
// that has no authenticated load).
//
// Up to three signals are compared with the tenant's count k; each has a
// threshold that scales with k (at least one must be configured):
//   - connections: load > T·k, with T = TargetPerNode;
//   - share: load/all > F·k/N, with F = ShareFactor, all the connections
//     counted on every node and N the members (its share of connections
//     exceeds its share of nodes by the factor; equivalently, its
//     connections per node exceed F times the router's mean per node),
//     counted only while load > k (with no more connections than nodes,
//     another node could take none) and all ≥ N (below one connection per
//     member no node is loaded: the first tenant of a quiet router holds
//     100 % of its connections);
//   - requests: rate > R·k, with R = TargetRequestsPerNode and rate the
//     tenant's client messages per second (after the first) on its
//     counted connections, measured over windows of RateWindow.
//
// The rule, with base the tenant's count without Auto:
//   - grow: a connection arriving while the connections or share signal
//     is above its threshold gives k+1 (up to Max and the members), one
//     step per arrival; a rate window that ends above its threshold gives
//     k+1, one step per window. The new node is the next in rendezvous
//     order, so only this tenant's placement changes and its connections
//     stay where they are;
//   - shrink: every configured signal below half its threshold without a
//     break for CoolDown gives k−1 (down to base), and another CoolDown
//     must pass for each further step; the dropped node takes no new
//     connection of the tenant and drains;
//   - in between nothing changes. Just after growing, the signal that grew
//     it is about its threshold at k, above half the threshold at k+1;
//     just after shrinking, every signal is below half its threshold at k,
//     at most its threshold at k−1 for k ≥ 2: neither step can undo the
//     other at once, so a load that oscillates around one threshold changes
//     k once, not every swing.
//
// With a per-node ceiling (max_per_node), a tenant all of whose nodes are
// full also grows one step (if Max allows, and if no more of its
// connections are unanswered than authenticated), else the connection is
// refused with ErrBusy.
type Auto struct {
	TargetPerNode         int           // connections per node above which a tenant grows (0: off)
	ShareFactor           float64       // share of connections over share of nodes above which it grows (0: off)
	TargetRequestsPerNode float64       // client messages per second per node above which it grows (0: off)
	Max                   int           // most partitions a tenant is grown to (0: every member)
	CoolDown              time.Duration // every signal below half its threshold this long: shrink one step
}

// RateWindow is the window over which a tenant's request rate is measured:
// Tick closes a window once it is at least this long.
const RateWindow = time.Second

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

	// requests counts client messages on the tenant's counted connections
	// (Lease.Requests adds to it without the lock); Tick turns it into
	// rate, per RateWindow.
	requests  atomic.Uint64
	rateAt    time.Time // start of the current window; zero: none yet
	rateTotal uint64    // requests at rateAt
	rate      float64   // messages per second over the last whole window
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
	if auto != nil && (auto.TargetPerNode < 0 || auto.ShareFactor < 0 || auto.TargetRequestsPerNode < 0 ||
		auto.TargetPerNode == 0 && auto.ShareFactor == 0 && auto.TargetRequestsPerNode == 0 ||
		auto.ShareFactor != 0 && auto.ShareFactor < 1 || auto.Max < 0 || auto.CoolDown <= 0) {
		return errors.New("auto partitions need target_per_node ≥ 1, share_factor ≥ 1 or target_requests_per_node > 0 " +
			"(at least one), max ≥ 0 and a positive cool_down")
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

// over says why tenant's load is above a connections or share threshold
// at k with arriving more connections ("": it is not); p.auto is set and
// p.am held.
func (p *Placer) over(l *load, k, members, arriving int) string {
	a, load := p.auto, l.effective(arriving)
	if a.TargetPerNode > 0 && load > a.TargetPerNode*k {
		return fmt.Sprintf("%d connections over %d nodes: above target_per_node %d", load, k, a.TargetPerNode)
	}
	if a.ShareFactor > 0 && load > k && members > 0 {
		all := p.allConns() + int64(arriving)
		if all >= int64(members) && float64(load)*float64(members) > a.ShareFactor*float64(k)*float64(all) {
			return fmt.Sprintf("%d of %d connections (%.1f %%) over %d of %d nodes (%.1f %%): above share_factor %g",
				load, all, 100*float64(load)/float64(all), k, members, 100*float64(k)/float64(members), a.ShareFactor)
		}
	}
	return ""
}

// under reports whether every configured signal of l is below half its
// threshold at k, with all the connections counted on every node; p.auto
// is set and p.am held.
func (p *Placer) under(l *load, k, members int, all int64) bool {
	a, load := p.auto, l.effective(0)
	if a.TargetPerNode > 0 && 2*load >= a.TargetPerNode*k {
		return false
	}
	if a.ShareFactor > 0 && load > 0 && 2*float64(load)*float64(members) >= a.ShareFactor*float64(k)*float64(all) {
		return false
	}
	if a.TargetRequestsPerNode > 0 && 2*l.rate >= a.TargetRequestsPerNode*float64(k) {
		return false
	}
	return true
}

// allConns is the connections counted on every node; p.mu is held.
func (p *Placer) allConns() int64 {
	var all int64
	for _, c := range p.conns {
		all += c.Load()
	}
	return all
}

// change sets tenant's count from k to to and records it; p.am is held.
func (p *Placer) change(tenant string, l *load, from, to int, now time.Time, reason string) {
	grew := to > from
	l.k, l.changed, l.reason, l.grew, l.below = to, now, reason, grew, time.Time{}
	if grew {
		p.changes[0].Add(1)
	} else {
		p.changes[1].Add(1)
	}
	p.history.add(Change{Time: now, Tenant: tenant, Grew: grew, From: from, To: to, Reason: reason})
}

// forget drops an idle tenant's entry at its base count; p.am is held.
func (p *Placer) forget(tenant string, l *load) {
	if l != nil && l.auth == 0 && l.pending == 0 && l.k <= p.partitions(tenant) {
		delete(p.loads, tenant)
	}
}

// settle applies the shrink rule to one tenant at now, with all the
// connections counted on every node, and reports whether it shrank; p.mu
// (read) and p.am are held.
func (p *Placer) settle(tenant string, l *load, now time.Time, all int64) (shrunk bool) {
	base := p.partitions(tenant)
	a := p.auto
	if a == nil || l.k <= base {
		l.below = time.Time{}
		p.forget(tenant, l)
		return false
	}
	members := len(p.nodes)
	if !p.under(l, l.k, members, all) {
		l.below = time.Time{}
		return false
	}
	if l.below.IsZero() {
		l.below = now
		return false
	}
	if shrunk = now.Sub(l.below) >= a.CoolDown; shrunk {
		p.change(tenant, l, l.k, l.k-1, now, fmt.Sprintf("%s: below half of %s for cool_down %v",
			p.describe(l, l.k, members, all), p.thresholds(), a.CoolDown))
		if l.k > base && p.under(l, l.k, members, all) {
			l.below = now // the next step needs another cool_down
		}
	}
	p.forget(tenant, l)
	return shrunk
}

// describe is l's signals in words, for a change's reason; p.auto is set.
func (p *Placer) describe(l *load, k, members int, all int64) string {
	s := fmt.Sprintf("%d connections over %d nodes", l.effective(0), k)
	if p.auto.ShareFactor > 0 && all > 0 {
		s += fmt.Sprintf(" (%.1f %% of %d, %d of %d nodes)", 100*float64(l.effective(0))/float64(all), all, k, members)
	}
	if p.auto.TargetRequestsPerNode > 0 {
		s += fmt.Sprintf(", %.0f requests per second", l.rate)
	}
	return s
}

// thresholds names the configured signals; p.auto is set.
func (p *Placer) thresholds() string {
	a, s := p.auto, ""
	add := func(t string) {
		if s != "" {
			s += " and "
		}
		s += t
	}
	if a.TargetPerNode > 0 {
		add(fmt.Sprintf("target_per_node %d", a.TargetPerNode))
	}
	if a.ShareFactor > 0 {
		add(fmt.Sprintf("share_factor %g", a.ShareFactor))
	}
	if a.TargetRequestsPerNode > 0 {
		add(fmt.Sprintf("target_requests_per_node %g", a.TargetRequestsPerNode))
	}
	return s
}

// sample closes l's rate window if it is RateWindow long at now, and
// reports whether it did; p.am is held.
func (l *load) sample(now time.Time) bool {
	total := l.requests.Load()
	if l.rateAt.IsZero() || now.Before(l.rateAt) {
		l.rateAt, l.rateTotal = now, total
		return false
	}
	elapsed := now.Sub(l.rateAt)
	if elapsed < RateWindow {
		return false
	}
	l.rate = float64(total-l.rateTotal) / elapsed.Seconds()
	l.rateAt, l.rateTotal = now, total
	return true
}

// Tick measures each tracked tenant's request rate, grows a tenant whose
// rate window ended above target_requests_per_node·k, and applies the
// shrink rule to every tenant: a router calls it every half second, so a
// tenant with no arrivals or departures shrinks when its cool-down ends.
// It returns the tenants whose count changed.
func (p *Placer) Tick(now time.Time) (changed []string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.am.Lock()
	defer p.am.Unlock()
	all, members := p.allConns(), len(p.nodes)
	for tenant, l := range p.loads {
		sampled := l.sample(now)
		if a := p.auto; a != nil && sampled && a.TargetRequestsPerNode > 0 {
			k := max(p.partitions(tenant), l.k)
			if l.rate > a.TargetRequestsPerNode*float64(k) && k < p.maxK(members) {
				p.change(tenant, l, k, k+1, now, fmt.Sprintf("%.0f requests per second over %d nodes: above target_requests_per_node %g",
					l.rate, k, a.TargetRequestsPerNode))
				changed = append(changed, tenant)
				continue
			}
		}
		if p.settle(tenant, l, now, all) {
			changed = append(changed, tenant)
		}
	}
	return changed
}

// TenantLoad is a tracked tenant's load and partitions, for the admin view.
type TenantLoad struct {
	Authenticated int       // connections whose bind succeeded
	Pending       int       // connections whose first bind is unanswered
	Partitions    int       // k now (auto may have grown it)
	Changed       time.Time // last change by Auto; zero: none
	Reason        string    // why
	Grew          bool      // the last change grew k
	// RequestsPerSecond is the client messages per second on its counted
	// connections over the last whole RateWindow.
	RequestsPerSecond float64
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
			Changed: l.changed, Reason: l.reason, Grew: l.grew, RequestsPerSecond: l.rate}
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
