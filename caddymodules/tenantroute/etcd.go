package tenantroute

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// EtcdMembership reads the node set from etcd, where the nodes register
// themselves (as Foxpass's register in ZooKeeper): each node puts its
// host:port under Prefix with a lease it keeps alive (etcdctl lease grant
// 10; etcdctl put --lease=ID PREFIX/node-4 10.0.1.4:389; etcdctl lease
// keep-alive ID), and a node whose lease lapses leaves. The router watches
// the prefix and re-places tenants at once. While etcd is unreachable it
// routes on with the last members it knew and says so in logs and metrics.
//
// With AssignmentPrefix set, the router publishes each known tenant's
// nodes there (AssignmentPrefix/<tenant> = ["host:port", …]), so every node
// can watch and load only its own tenants' data. A membership change is
// applied to routing only after the assignment it brings is written: see
// publishAll and the README's Membership section.
type EtcdMembership struct {
	Endpoints        []string `json:"endpoints"`
	Prefix           string   `json:"prefix"`
	AssignmentPrefix string   `json:"assignment_prefix,omitempty"`
	// SizesPrefix, with partitions_by_size, holds tenant sizes
	// (<sizes_prefix><tenant> = decimal size), watched like the members.
	SizesPrefix string `json:"sizes_prefix,omitempty"`
}

// etcdWatcher is pooled with the handler's state: one watch per name
// across reloads, stopped when the last config using the name goes.
type etcdWatcher struct {
	// cfg and logger are the newest generation's: a reload that keeps the
	// endpoints and prefix keeps the watch and updates these.
	cfg    atomic.Pointer[EtcdMembership]
	logger atomic.Pointer[zap.Logger]
	prefix string
	placer *placement.Placer
	seen   *placement.Recent // the state's tenants seen, bounded
	name   string
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	// kick asks the watch loop to publish every known tenant's assignment
	// again (a partition count changed).
	kick chan struct{}

	// pubMu orders publications: a membership change holds it from
	// reading the assignment through writing it to applying the new
	// members, so a connection's publication (which takes it when its
	// tenant's value looks out of date) never writes an older placement
	// over a newer one.
	pubMu sync.Mutex

	mu        sync.Mutex // guards the fields below; never held across I/O
	updated   time.Time
	lastErr   string
	pubPrefix string            // the assignment prefix published holds values of
	published map[string]string // tenant → value last written (a cache, bounded)
}

// maxTxnOps is etcd's default limit of operations in one transaction
// (--max-txn-ops).
const maxTxnOps = 128

func startEtcd(cfg *EtcdMembership, p *placement.Placer, seen *placement.Recent, logger *zap.Logger, name string) (*etcdWatcher, error) {
	if len(cfg.Endpoints) == 0 || cfg.Prefix == "" {
		return nil, fmt.Errorf("tenant_route: etcd membership needs endpoints and a prefix")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("tenant_route: etcd %v: %v", cfg.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &etcdWatcher{prefix: cfg.Prefix, placer: p, seen: seen, name: name, cli: cli, cancel: cancel,
		done: make(chan struct{}), kick: make(chan struct{}, 1), published: map[string]string{}}
	w.cfg.Store(cfg)
	w.logger.Store(logger)
	go w.run(ctx)
	return w, nil
}

func (w *etcdWatcher) stop() {
	w.cancel()
	<-w.done
	w.cli.Close()
}

// run loads the prefix, watches it, and starts over after any failure.
// Each start (the first, and after a failure) publishes every known
// tenant's assignment even if the members did not change, which mends
// what a failed or interrupted publication left behind.
func (w *etcdWatcher) run(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		rev, err := w.load(ctx, true)
		if err == nil {
			err = w.watch(ctx, rev)
		}
		if ctx.Err() != nil {
			return
		}
		w.fail(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// load reads the members and applies them (publishing the assignment first
// when they changed, or always with republish).
func (w *etcdWatcher) load(ctx context.Context, republish bool) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := w.cli.Get(gctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	var nodes []string
	for _, kv := range resp.Kvs {
		nodes = append(nodes, strings.TrimSpace(string(kv.Value)))
	}
	return resp.Header.Revision, w.apply(ctx, nodes, republish)
}

// watch follows the prefix from rev. A watch on a dead server just waits
// for it, so a health check every two seconds notices the loss.
func (w *etcdWatcher) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	events := w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	health := time.NewTicker(2 * time.Second)
	defer health.Stop()
	for {
		select {
		case resp, ok := <-events:
			if !ok {
				return fmt.Errorf("etcd watch ended")
			}
			if err := resp.Err(); err != nil {
				return err
			}
			// Any change: re-read the whole prefix (small) for a consistent set.
			if _, err := w.load(ctx, false); err != nil {
				return err
			}
		case <-w.kick:
			w.pubMu.Lock()
			err := w.publishAll(ctx, w.placer.Nodes())
			w.pubMu.Unlock()
			if err != nil {
				return fmt.Errorf("publishing the assignment: %w", err)
			}
		case <-health.C:
			hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := w.cli.Get(hctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			hcancel()
			if err != nil {
				return err
			}
			w.mu.Lock()
			w.updated = time.Now()
			w.mu.Unlock()
		}
	}
}

// apply makes nodes the members. When they differ from the members in
// force (or with republish), every known tenant's assignment under the new
// members is written first, and only then are the members applied to
// routing: a node is named in a tenant's assignment before that tenant's
// first connection can reach it. If the assignment cannot be written, the
// members are left as they were and the error returned (the watch starts
// over and tries again).
func (w *etcdWatcher) apply(ctx context.Context, nodes []string, republish bool) error {
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	w.pubMu.Lock()
	defer w.pubMu.Unlock()
	before := w.placer.Nodes()
	changed := !slices.Equal(before, nodes)
	if changed || republish {
		if err := w.publishAll(ctx, nodes); err != nil {
			return fmt.Errorf("publishing the assignment for members %v: %w", nodes, err)
		}
	}
	w.placer.SetNodes(nodes)
	w.mu.Lock()
	w.updated, w.lastErr = time.Now(), ""
	w.mu.Unlock()
	membershipStale.WithLabelValues(w.name).Set(0)
	if changed {
		membershipChanges.WithLabelValues(w.name).Inc()
		w.logger.Load().Info("membership changed", zap.Strings("nodes", nodes), zap.Strings("before", before))
	}
	return nil
}

// publishAll writes the assignment of every known tenant under members
// where etcd holds another value; w.pubMu is held. The known tenants are
// those with their own partition count (config or run time), those seen
// on connections (bounded: w.seen), and those listed under the assignment
// prefix already (by an earlier run or another router; at most
// maxTrackedTenants are read).
func (w *etcdWatcher) publishAll(ctx context.Context, members []string) error {
	prefix := w.cfg.Load().AssignmentPrefix
	if prefix == "" {
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := w.cli.Get(gctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(maxTrackedTenants))
	cancel()
	if err != nil {
		return err
	}
	if resp.More {
		w.logger.Load().Warn("more assignments listed than are read: only the first are kept up to date",
			zap.String("assignment_prefix", prefix), zap.Int("read", len(resp.Kvs)))
	}
	listed := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if tenant := strings.TrimPrefix(string(kv.Key), prefix); tenant != "" {
			listed[tenant] = string(kv.Value)
		}
	}
	known := maps.Clone(listed)
	for tenant := range w.placer.Overrides() {
		known[tenant] = ""
	}
	for tenant := range w.placer.SizedTenants() {
		known[tenant] = ""
	}
	for _, tenant := range w.seen.Names() {
		known[tenant] = ""
	}
	want := make(map[string]string, len(known))
	var ops []clientv3.Op
	for tenant := range known {
		b, _ := json.Marshal(w.placer.PlaceAmong(tenant, members))
		if want[tenant] = string(b); listed[tenant] != want[tenant] {
			ops = append(ops, clientv3.OpPut(prefix+tenant, want[tenant]))
		}
	}
	written := len(ops)
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.cli.Txn(tctx).Then(ops[:n]...).Commit()
		cancel()
		if err != nil {
			return err
		}
		ops = ops[n:]
	}
	w.mu.Lock()
	w.pubPrefix, w.published = prefix, want
	w.mu.Unlock()
	w.logger.Load().Info("assignment published", zap.Strings("nodes", members),
		zap.Int("tenants", len(known)), zap.Int("written", written))
	return nil
}

// republish asks the watch loop to publish every known tenant again, after
// a partition count changed; it does not wait.
func (w *etcdWatcher) republish() {
	select {
	case w.kick <- struct{}{}:
	default: // one is pending already
	}
}

func (w *etcdWatcher) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if msg := err.Error(); msg != w.lastErr {
		w.logger.Load().Warn("etcd unreachable: routing on with the last known members",
			zap.Strings("nodes", w.placer.Nodes()), zap.Error(err))
		w.lastErr = msg
	}
	membershipStale.WithLabelValues(w.name).Set(1)
}

func (w *etcdWatcher) health() (updated time.Time, lastErr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.updated, w.lastErr
}

// publish writes tenant's nodes under the assignment prefix if they are
// not what was last written, before the connection is routed, so a node
// is named in a tenant's assignment before that tenant's connection
// reaches it. While etcd is unreachable it writes nothing (the
// connection is not held up); the watch publishes every known tenant
// when etcd is back.
func (w *etcdWatcher) publish(tenant string) {
	prefix := w.cfg.Load().AssignmentPrefix
	if prefix == "" {
		return
	}
	value := func() string {
		b, _ := json.Marshal(w.placer.Place(tenant))
		return string(b)
	}
	current := func(v string) (ok, stale bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.pubPrefix != prefix { // a reload changed assignment_prefix
			w.pubPrefix, w.published = prefix, map[string]string{}
		}
		return w.published[tenant] == v, w.lastErr != ""
	}
	if ok, stale := current(value()); ok || stale {
		return
	}
	w.pubMu.Lock()
	defer w.pubMu.Unlock()
	v := value() // a membership change may have been applied meanwhile
	if ok, _ := current(v); ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := w.cli.Put(ctx, prefix+tenant, v); err != nil {
		w.logger.Load().Warn("publishing an assignment", zap.String("tenant", tenant), zap.Error(err))
		return
	}
	w.mu.Lock()
	if len(w.published) >= 2*maxTrackedTenants {
		w.published = map[string]string{} // a cache: refilled one tenant at a time
	}
	w.published[tenant] = v
	w.mu.Unlock()
}
