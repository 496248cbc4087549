// Package placement places tenants on nodes as Foxpass's LDAP routing
// layer does with Apache Helix (each tenant on a few nodes, so each node
// caches few tenants' data), but without a controller: each tenant has k
// partitions, held by the k live nodes with the highest rendezvous
// (highest random weight) hash for that tenant. A node joining or leaving
// moves only the tenants whose top k it enters or leaves, about k/N of
// them. Among a tenant's nodes a new connection goes to the one with the
// fewest live connections, ties broken by rendezvous order, so none of a
// tenant's nodes runs hot while another of them has room; the node is
// reserved in the same atomic step as it is picked, so a burst of
// simultaneous connections spreads as evenly as a sequence (Reserve,
// Connect). A node that cannot be dialled is marked down for a cool-off
// and skipped. It knows nothing of Caddy or LDAP.
package placement

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// weight is the rendezvous weight of (tenant, node): FNV-1a over both,
// finished with SplitMix64's mixer. It is stable across processes, so
// every router instance computes the same placement.
func weight(tenant, node string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(tenant); i++ {
		h = (h ^ uint64(tenant[i])) * prime
	}
	h = (h ^ 0xff) * prime // separator: ("ab","c") ≠ ("a","bc")
	for i := 0; i < len(node); i++ {
		h = (h ^ uint64(node[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Rank returns nodes ordered by rendezvous weight for tenant, highest first.
func Rank(tenant string, nodes []string) []string {
	out := slices.Clone(nodes)
	ws := make(map[string]uint64, len(out))
	for _, n := range out {
		ws[n] = weight(tenant, n)
	}
	slices.SortFunc(out, func(a, b string) int {
		switch wa, wb := ws[a], ws[b]; {
		case wa > wb:
			return -1
		case wa < wb:
			return 1
		}
		return 0
	})
	return out
}

// Placer holds the live nodes, each tenant's partition count, and the
// connections routed to each node. It is process state: a config reload
// hands the same Placer to the next generation, which applies its own
// settings with Configure and SetNodes; live counts and run-time overrides
// carry over (see those methods for what resets).
type Placer struct {
	mu       sync.RWMutex
	defaultK int
	nodes    []string       // sorted
	configK  map[string]int // per-tenant counts from the config
	runtimeK map[string]int // per-tenant counts set at run time; win over configK
	// sizes are tenants' sizes, mapped to counts by sizeTable (size.go);
	// configK and runtimeK win over them.
	sizeTable SizeTable
	sizes     map[string]int64
	down      map[string]time.Time // node → end of its cool-off
	conns     map[string]*atomic.Int64

	// Load-driven partitions and node ceilings (auto.go). am guards loads
	// and serialises Acquire, so growth decisions see every arrival.
	auto       *Auto
	maxPerNode int64
	am         sync.Mutex
	loads      map[string]*load
	unauth     atomic.Int64     // connections whose bind failed, counted nowhere else
	changes    [2]atomic.Uint64 // partition changes: grow, shrink
	busy       atomic.Uint64
	history    changeRing // the last partition changes (history.go)
}

// New returns a placer with partition count k per tenant by default.
func New(k int) (*Placer, error) {
	p := &Placer{configK: map[string]int{}, runtimeK: map[string]int{}, down: map[string]time.Time{},
		conns: map[string]*atomic.Int64{}, loads: map[string]*load{}}
	return p, p.Configure(k, nil)
}

// Configure applies a config generation's partition counts: k for every
// tenant, tenantK for some. Live counts, cool-offs and run-time overrides
// are kept, except that a tenant whose configured count changed (set,
// changed or removed) loses its run-time override: the edited config is
// the newer word on that tenant.
func (p *Placer) Configure(k int, tenantK map[string]int) error {
	if k < 1 {
		return errors.New("partitions must be at least 1")
	}
	for tenant, tk := range tenantK {
		if tk < 1 {
			return fmt.Errorf("partitions of %s must be at least 1", tenant)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for tenant := range p.runtimeK {
		if old, now := p.configK[tenant], tenantK[tenant]; old != now {
			delete(p.runtimeK, tenant)
		}
	}
	p.defaultK = k
	p.configK = maps.Clone(tenantK)
	if p.configK == nil {
		p.configK = map[string]int{}
	}
	return nil
}

// DefaultPartitions returns the partition count of tenants without their own.
func (p *Placer) DefaultPartitions() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.defaultK
}

// SetNodes replaces the live node set (a membership change, or a reload
// that edits the list). A removed node is no longer placed or picked and
// its cool-off is forgotten; its open connections stay counted (listed by
// Conns) until they are released, then it is forgotten entirely.
func (p *Placer) SetNodes(nodes []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes = slices.Clone(nodes)
	slices.Sort(p.nodes)
	p.nodes = slices.Compact(p.nodes)
	for _, n := range p.nodes {
		if p.conns[n] == nil {
			p.conns[n] = new(atomic.Int64)
		}
	}
	for n, c := range p.conns {
		if !p.member(n) && c.Load() <= 0 {
			delete(p.conns, n)
		}
	}
	for n := range p.down {
		if !p.member(n) {
			delete(p.down, n)
		}
	}
}

// member reports whether node is in the live set; p.mu must be held.
func (p *Placer) member(node string) bool {
	_, ok := slices.BinarySearch(p.nodes, node)
	return ok
}

// Nodes returns the live nodes.
func (p *Placer) Nodes() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return slices.Clone(p.nodes)
}

// SetPartitions sets tenant's partition count at run time, over the
// config's (0: back to the config's count). It lasts across reloads until
// cleared, or until a reload changes that tenant's configured count.
func (p *Placer) SetPartitions(tenant string, k int) error {
	if k < 0 {
		return errors.New("partitions must not be negative")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if k == 0 {
		delete(p.runtimeK, tenant)
	} else {
		p.runtimeK[tenant] = k
	}
	return nil
}

// Partitions returns tenant's partition count.
func (p *Placer) Partitions(tenant string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.partitions(tenant)
}

func (p *Placer) partitions(tenant string) int {
	if k, ok := p.runtimeK[tenant]; ok {
		return k
	}
	if k, ok := p.configK[tenant]; ok {
		return k
	}
	if k, ok := p.sizeK(tenant); ok {
		return k
	}
	return p.defaultK
}

// Overrides returns the tenants with their own partition count, from the
// config or set at run time (run-time ones win).
func (p *Placer) Overrides() map[string]int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := maps.Clone(p.configK)
	maps.Copy(out, p.runtimeK)
	return out
}

// RuntimeOverrides returns the counts set at run time.
func (p *Placer) RuntimeOverrides() map[string]int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return maps.Clone(p.runtimeK)
}

// Place returns tenant's nodes: the top k live nodes by rendezvous weight,
// with k as auto partitions may have grown it.
func (p *Placer) Place(tenant string) []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	ranked := Rank(tenant, p.nodes)
	return ranked[:min(p.current(tenant), len(ranked))]
}

// current is tenant's k now: its own or default count, or more if auto
// partitions grew it; p.mu is held.
func (p *Placer) current(tenant string) int {
	k := p.partitions(tenant)
	p.am.Lock()
	defer p.am.Unlock()
	if l := p.loads[tenant]; l != nil {
		k = max(k, l.k)
	}
	return k
}

// PlaceAmong returns tenant's nodes if the live set were nodes: the top k
// of them by rendezvous weight, with tenant's own k. A router computes the
// assignment a membership change will bring with it before applying the
// change (SetNodes), so it can publish it first.
func (p *Placer) PlaceAmong(tenant string, nodes []string) []string {
	p.mu.RLock()
	k := p.current(tenant)
	p.mu.RUnlock()
	nodes = slices.Clone(nodes)
	slices.Sort(nodes)
	ranked := Rank(tenant, slices.Compact(nodes))
	return ranked[:min(k, len(ranked))]
}

// Reserve chooses the node for a new connection of tenant at now and
// counts the connection on it in the same step: among the tenant's nodes
// not cooling off, the one with the fewest connections, ties by rendezvous
// order; if all of them are down, the next node in rendezvous order. The
// count is taken with a compare-and-swap against the count the choice was
// made on, and the choice is made again if another connection got there
// first, so connections arriving together spread as if they came one by
// one. The caller must Release the node when the connection ends or cannot
// be made. ok is false with no usable node.
func (p *Placer) Reserve(tenant string, now time.Time) (node string, ok bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	ranked := Rank(tenant, p.nodes)
	k := min(p.partitions(tenant), len(ranked))
	for {
		best, bestConns, _ := p.choose(ranked, k, now)
		if best == "" {
			return "", false
		}
		if p.conns[best].CompareAndSwap(bestConns, bestConns+1) {
			return best, true
		}
	}
}

// choose is Reserve's choice without the count: among the first k of
// ranked not cooling off and below max_per_node, the one with the fewest
// connections (ties by rank); if all of them are cooling off, the next
// usable node past them. full counts the tenant's nodes at the ceiling: a
// connection finds no node when they are all down or full, and some full.
// p.mu is held.
func (p *Placer) choose(ranked []string, k int, now time.Time) (best string, bestConns int64, full int) {
	for i, n := range ranked {
		if i >= k && (best != "" || full > 0) {
			break // a node among the tenant's own was usable, or they are full
		}
		if p.coolingOff(n, now) {
			continue
		}
		c := p.conns[n].Load()
		if p.maxPerNode > 0 && c >= p.maxPerNode {
			if i < k {
				full++
			}
			continue
		}
		if best == "" || (i < k && c < bestConns) {
			best, bestConns = n, c
		}
		if i >= k {
			break // first usable node past the tenant's own
		}
	}
	return best, bestConns, full
}

func (p *Placer) coolingOff(node string, now time.Time) bool {
	until, down := p.down[node]
	return down && now.Before(until)
}

// Source of a tenant's partition count, as Explain reports it.
const (
	SourceDefault = "default" // the handler's partitions
	SourceConfig  = "config"  // the tenant's own count in the config
	SourceRuntime = "runtime" // set at run time, over the config
	SourceSize    = "size"    // from the tenant's size (partitions_by_size)
	SourceAuto    = "auto"    // grown by auto_partitions above the others
)

// NodeState is one of a tenant's nodes as Explain sees it.
type NodeState struct {
	Node            string
	Rank            int // 1 = the tenant's first node in rendezvous order
	OpenConnections int64
	CoolOffUntil    time.Time // zero unless cooling off at the time asked
}

// Explanation is where a new connection of a tenant would go, and why,
// without reserving anything.
type Explanation struct {
	Partitions int    // k
	Source     string // where k comes from: SourceDefault, SourceSize, SourceConfig, SourceRuntime, SourceAuto
	Members    int    // live nodes
	Nodes      []NodeState
	Next       string // the node a new connection would take now; "" with none usable
	Reason     string // why Next
}

// Explain answers where a new connection of tenant would go at now, as
// Reserve would choose, without counting it: operators ask it before
// moving a customer.
func (p *Placer) Explain(tenant string, now time.Time) Explanation {
	p.mu.RLock()
	defer p.mu.RUnlock()
	ranked := Rank(tenant, p.nodes)
	e := Explanation{Partitions: p.partitions(tenant), Source: SourceDefault, Members: len(ranked)}
	if _, ok := p.runtimeK[tenant]; ok {
		e.Source = SourceRuntime
	} else if _, ok := p.configK[tenant]; ok {
		e.Source = SourceConfig
	} else if _, ok := p.sizeK(tenant); ok {
		e.Source = SourceSize
	}
	p.am.Lock()
	if l := p.loads[tenant]; l != nil && l.k > e.Partitions {
		e.Source, e.Partitions = SourceAuto, l.k
	}
	p.am.Unlock()
	k := min(e.Partitions, len(ranked))
	for i, n := range ranked[:k] {
		st := NodeState{Node: n, Rank: i + 1, OpenConnections: p.conns[n].Load()}
		if p.coolingOff(n, now) {
			st.CoolOffUntil = p.down[n]
		}
		e.Nodes = append(e.Nodes, st)
	}
	var conns int64
	var full int
	e.Next, conns, full = p.choose(ranked, k, now)
	switch {
	case len(ranked) == 0:
		e.Reason = "no members"
	case e.Next == "" && full > 0:
		e.Reason = fmt.Sprintf("%d of the tenant's nodes are at max_per_node and the rest cooling off: "+
			"the tenant grows if auto_partitions allows, otherwise the connection is refused (busy)", full)
	case e.Next == "":
		e.Reason = "every member is cooling off after a failure"
	case !slices.Contains(ranked[:k], e.Next):
		e.Reason = fmt.Sprintf("all %d of the tenant's nodes are cooling off: the next member in rendezvous order", k)
	case k == 1:
		e.Reason = "the tenant's only node"
	default:
		e.Reason = fmt.Sprintf("fewest open connections (%d) among the tenant's %d nodes not cooling off; ties go to the higher rendezvous rank", conns, k)
	}
	return e
}

// Release uncounts a connection. The last connection to a node that has
// left the set forgets the node.
func (p *Placer) Release(node string) {
	p.mu.RLock()
	c := p.conns[node]
	p.mu.RUnlock()
	if c == nil || c.Add(-1) > 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[node]; c != nil && c.Load() <= 0 && !p.member(node) {
		delete(p.conns, node)
	}
}

// ErrNoRetry, wrapped in a dial error, ends Connect after that node: what
// was sent to it must not be sent to another.
var ErrNoRetry = errors.New("not retried on another node")

// Connect acquires a node for tenant (Acquire) and dials it. A node whose
// dial fails is released, cools off for coolOff (skipped until then), is
// reported to failed, and the next choice is dialled, up to one try per
// node (none more if the error wraps ErrNoRetry). ErrBusy (every node of
// the tenant at max_per_node) ends it at once. On success the caller owns
// the lease and must Release it when the connection ends.
func Connect[C any](p *Placer, tenant string, coolOff time.Duration, dial func(node string) (C, error),
	failed func(node string, err error)) (lease *Lease, conn C, err error) {
	err = ErrNoNode
	for range max(1, len(p.Nodes())) {
		ls, aerr := p.Acquire(tenant, time.Now())
		if aerr != nil {
			if errors.Is(aerr, ErrBusy) {
				err = aerr
			}
			break
		}
		c, derr := dial(ls.Node)
		if derr == nil {
			return ls, c, nil
		}
		ls.Release(time.Now())
		p.MarkDown(ls.Node, time.Now().Add(coolOff))
		if failed != nil {
			failed(ls.Node, derr)
		}
		err = derr
		if errors.Is(derr, ErrNoRetry) {
			break
		}
	}
	var zero C
	return nil, zero, err
}

// Conns returns the connections counted per node.
func (p *Placer) Conns() map[string]int64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[string]int64, len(p.conns))
	for n, c := range p.conns {
		out[n] = c.Load()
	}
	return out
}

// MarkDown skips node until the cool-off ends.
func (p *Placer) MarkDown(node string, until time.Time) {
	p.mu.Lock()
	p.down[node] = until
	p.mu.Unlock()
}
