package tenantroute

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// EtcdMembership reads the node set from etcd, as the seed's nodes
// register in ZooKeeper: each node puts its host:port under Prefix with a
// lease it keeps alive (etcdctl lease grant 10; etcdctl put --lease=ID
// PREFIX/node-4 10.0.1.4:389; etcdctl lease keep-alive ID), and a node whose
// lease lapses leaves. The router watches the prefix and re-places tenants
// at once. While etcd is unreachable it routes on with the last members it
// knew and says so in logs and metrics.
//
// With AssignmentPrefix set, the router publishes each connected tenant's
// nodes there (AssignmentPrefix/<tenant> = ["host:port", …]), so every node
// can watch and load only its own tenants' data.
type EtcdMembership struct {
	Endpoints        []string `json:"endpoints"`
	Prefix           string   `json:"prefix"`
	AssignmentPrefix string   `json:"assignment_prefix,omitempty"`
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
	name   string
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	updated   time.Time
	lastErr   string
	published map[string]string // tenant → last published value
}

func startEtcd(cfg *EtcdMembership, p *placement.Placer, logger *zap.Logger, name string) (*etcdWatcher, error) {
	if len(cfg.Endpoints) == 0 || cfg.Prefix == "" {
		return nil, fmt.Errorf("tenant_route: etcd membership needs endpoints and a prefix")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("tenant_route: etcd %v: %v", cfg.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &etcdWatcher{prefix: cfg.Prefix, placer: p, name: name, cli: cli, cancel: cancel, done: make(chan struct{}), published: map[string]string{}}
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
func (w *etcdWatcher) run(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		rev, err := w.load(ctx)
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

func (w *etcdWatcher) load(ctx context.Context) (int64, error) {
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
	w.apply(nodes)
	return resp.Header.Revision, nil
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
			if _, err := w.load(ctx); err != nil {
				return err
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

func (w *etcdWatcher) apply(nodes []string) {
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	before := w.placer.Nodes()
	w.placer.SetNodes(nodes)
	w.mu.Lock()
	w.updated, w.lastErr = time.Now(), ""
	w.mu.Unlock()
	membershipStale.WithLabelValues(w.name).Set(0)
	if !slices.Equal(before, nodes) {
		membershipChanges.WithLabelValues(w.name).Inc()
		w.logger.Load().Info("membership changed", zap.Strings("nodes", nodes), zap.Strings("before", before))
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

func (w *etcdWatcher) state() (updated time.Time, lastErr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.updated, w.lastErr
}

// publish writes tenant's nodes under the assignment prefix when they
// changed since the last write.
func (w *etcdWatcher) publish(tenant string, nodes []string) {
	prefix := w.cfg.Load().AssignmentPrefix
	if prefix == "" {
		return
	}
	b, _ := json.Marshal(nodes)
	w.mu.Lock()
	if w.published[tenant] == string(b) || len(w.published) >= maxTrackedTenants {
		w.mu.Unlock()
		return
	}
	w.published[tenant] = string(b)
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := w.cli.Put(ctx, prefix+tenant, string(b)); err != nil {
		w.mu.Lock()
		delete(w.published, tenant)
		w.mu.Unlock()
		w.logger.Load().Warn("publishing an assignment", zap.String("tenant", tenant), zap.Error(err))
	}
}
