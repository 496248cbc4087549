package tenantroute

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// states keeps each tenant_route name's process state across config
// reloads. Caddy provisions the new config before it cleans up the old
// one, so during a reload the state is referenced by both generations and
// the old one's Cleanup only drops a reference; the state goes (and its
// etcd watch stops) when no loaded config uses the name any more.
var states = caddy.NewUsagePool()

// state is what outlives a config generation for one name: the placer
// (node set, live connection counts, run-time partition overrides,
// cool-offs), the tenants connected now, and the etcd membership watch.
// Connections routed by any generation count here, so an old generation's
// connections that are still relaying keep counting after a reload.
type state struct {
	name      string
	placer    *placement.Placer
	connected tenants
	// seen are the tenants routed lately, whose assignment a membership
	// change publishes again; bounded, as names come from clients.
	seen    *placement.Recent
	watcher atomic.Pointer[etcdWatcher] // nil with static membership
	sizes   atomic.Pointer[sizesFeed]   // nil without a source of tenant sizes
	// failed counts failed binds per tenant (the most recent
	// maxFailedTenants tenants: names come from clients).
	failed   *placement.Tally
	stopTick chan struct{}

	mu sync.Mutex
	// handlers are the ones using this name, in provisioning order; the
	// last one's settings are in force. Usually one, two during a reload;
	// if a new config fails to load, its handlers leave and the settings
	// of the one still running are applied again.
	handlers []*TenantRoute
	// etcdKey identifies the running watch's settings ("" with none).
	etcdKey string
}

func newState(name string) *state {
	p, _ := placement.New(1) // Configure sets the real count
	s := &state{name: name, placer: p, seen: placement.NewRecent(maxTrackedTenants),
		failed: placement.NewTally(maxFailedTenants), stopTick: make(chan struct{})}
	go s.tick()
	return s
}

// maxFailedTenants bounds the tenants whose failed binds are listed.
const maxFailedTenants = 1000

// tick runs auto partitions' clock every half second (request rates are
// measured, a tenant with no arrivals or departures grows by its rate or
// shrinks when its cool-down ends) and publishes the assignments of tenants
// whose count changed.
func (s *state) tick() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stopTick:
			return
		case now := <-t.C:
			for _, tenant := range s.placer.Tick(now) {
				if w := s.watcher.Load(); w != nil {
					w.publish(tenant)
				}
			}
		}
	}
}

// Destruct stops the etcd watch once no config uses the name.
func (s *state) Destruct() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.stopTick)
	if w := s.sizes.Swap(nil); w != nil {
		w.stop()
	}
	if w := s.watcher.Swap(nil); w != nil {
		w.stop()
	}
	s.etcdKey = ""
	return nil
}

// adopt looks up (or makes) the state of t.Name and applies t's settings.
func adopt(t *TenantRoute) (*state, error) {
	v, _, err := states.LoadOrNew(t.Name, func() (caddy.Destructor, error) { return newState(t.Name), nil })
	if err != nil {
		return nil, err
	}
	s := v.(*state)
	if err := s.attach(t); err != nil {
		states.Delete(t.Name)
		return nil, err
	}
	return s, nil
}

// release undoes adopt, at Cleanup.
func (s *state) release(t *TenantRoute) {
	s.detach(t)
	states.Delete(s.name)
}

func (s *state) attach(t *TenantRoute) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.handlers {
		// Two handlers of one config sharing a name must agree on what they
		// share; across generations a difference is the reload's change.
		if g.gen != nil && g.gen == t.gen && !sameStateSettings(g, t) {
			return fmt.Errorf("tenant_route: name %q: two handlers in this config share it with different nodes, "+
				"etcd or partitions; give each its own name", t.Name)
		}
	}
	s.handlers = append(s.handlers, t)
	if err := s.apply(t); err != nil {
		s.handlers = s.handlers[:len(s.handlers)-1]
		if len(s.handlers) > 0 {
			s.apply(s.handlers[len(s.handlers)-1])
		}
		return err
	}
	return nil
}

func (s *state) detach(t *TenantRoute) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.handlers, t)
	if i < 0 {
		return
	}
	s.handlers = slices.Delete(s.handlers, i, i+1)
	if i == len(s.handlers) && i > 0 {
		// The newest handler left first: its config failed to load.
		if err := s.apply(s.handlers[i-1]); err != nil {
			s.handlers[i-1].logger.Error("restoring the running config's membership", zap.Error(err))
		}
	}
}

// apply puts t's settings in force; s.mu is held. Live counts and run-time
// overrides stay (placement.Placer.Configure says which override resets);
// with unchanged etcd settings the watch and the members it found stay,
// otherwise the members are t's nodes (the starting set, with etcd).
func (s *state) apply(t *TenantRoute) error {
	if err := s.placer.Configure(t.Partitions, t.TenantPartitions); err != nil {
		return fmt.Errorf("tenant_route: %v", err)
	}
	var auto *placement.Auto
	if a := t.AutoPartitions; a != nil {
		auto = &placement.Auto{TargetPerNode: a.TargetPerNode, ShareFactor: a.ShareFactor,
			TargetRequestsPerNode: a.TargetRequestsPerNode, Max: a.Max, CoolDown: time.Duration(a.CoolDown)}
	}
	if err := s.placer.SetLimits(auto, t.MaxPerNode); err != nil {
		return fmt.Errorf("tenant_route: %v", err)
	}
	if err := s.applySizes(t); err != nil {
		return err
	}
	key := etcdKey(t.Etcd)
	if key != "" && key == s.etcdKey {
		w := s.watcher.Load()
		w.logger.Store(t.logger)
		w.cfg.Store(t.Etcd) // an assignment_prefix change needs no new watch
		w.republish()       // partition counts may have changed
		return nil
	}
	if w := s.watcher.Swap(nil); w != nil {
		w.stop()
	}
	s.etcdKey = ""
	s.placer.SetNodes(t.Nodes)
	if t.Etcd == nil {
		return nil
	}
	w, err := startEtcd(t.Etcd, s.placer, s.seen, t.logger, s.name)
	if err != nil {
		return err
	}
	s.watcher.Store(w)
	s.etcdKey = key
	return nil
}

// applySizes applies t's size table to the sizes held, and keeps the feed
// of an unchanged source or starts t's (a file is read at once; etcd
// sizes replace the ones held at its first listing); s.mu is held.
func (s *state) applySizes(t *TenantRoute) error {
	s.publishSizes(s.placer.SetSizeTable(t.sizeTable()))
	old := s.sizes.Load()
	var feed *sizesFeed
	var err error
	switch {
	case t.TenantSizesFile != "":
		if old != nil && old.key == "file:"+t.TenantSizesFile {
			old.setLogger(t.logger)
			return nil
		}
		feed, err = startSizesFile(t.TenantSizesFile, s.placer, t.logger, s.publishSizes)
	case t.Etcd != nil && t.Etcd.SizesPrefix != "":
		b, _ := json.Marshal([]any{t.Etcd.Endpoints, t.Etcd.SizesPrefix})
		if old != nil && old.key == "etcd:"+string(b) {
			old.setLogger(t.logger)
			return nil
		}
		feed, err = startSizesEtcd(t.Etcd, s.placer, t.logger, s.publishSizes)
	default:
		s.publishSizes(s.placer.ReplaceSizes(nil))
	}
	if err != nil {
		return err
	}
	if old != nil {
		old.stop()
	}
	s.sizes.Store(feed)
	return nil
}

// publishSizes publishes the assignments of tenants whose base count a
// size changed.
func (s *state) publishSizes(changed []string) {
	if w := s.watcher.Load(); w != nil && len(changed) > 0 {
		w.republish()
	}
}

// etcdKey is what a new etcd watch is needed for: the endpoints and prefix.
func etcdKey(e *EtcdMembership) string {
	if e == nil {
		return ""
	}
	b, _ := json.Marshal([]any{e.Endpoints, e.Prefix})
	return string(b)
}

func sameStateSettings(a, b *TenantRoute) bool {
	return a.Partitions == b.Partitions && maps.Equal(a.TenantPartitions, b.TenantPartitions) &&
		slices.Equal(a.PartitionsBySize, b.PartitionsBySize) && a.TenantSizesFile == b.TenantSizesFile &&
		(a.Etcd == nil) == (b.Etcd == nil) && (a.Etcd == nil || a.Etcd.SizesPrefix == b.Etcd.SizesPrefix) &&
		a.MaxPerNode == b.MaxPerNode && (a.AutoPartitions == nil) == (b.AutoPartitions == nil) &&
		(a.AutoPartitions == nil || *a.AutoPartitions == *b.AutoPartitions) &&
		slices.Equal(sortedSet(a.Nodes), sortedSet(b.Nodes)) && etcdKey(a.Etcd) == etcdKey(b.Etcd)
}

func sortedSet(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// defaultName names a handler without a name after its membership source:
// its node list, or its etcd endpoints and prefix. Handlers with different
// members never share state by accident; a reload that edits the static
// node list of an unnamed handler starts it afresh.
func defaultName(t *TenantRoute) string {
	h := sha256.New()
	json.NewEncoder(h).Encode([]any{sortedSet(t.Nodes), etcdKey(t.Etcd)})
	return "tenant_route-" + hex.EncodeToString(h.Sum(nil))[:8]
}

// liveStates lists the states in use, ordered by name.
func liveStates() []*state {
	var out []*state
	states.Range(func(_, v any) bool {
		out = append(out, v.(*state))
		return true
	})
	slices.SortFunc(out, func(a, b *state) int { return cmp.Compare(a.name, b.name) })
	return out
}

// Interface guard
var _ caddy.Destructor = (*state)(nil)
