package peerratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/quotaredis"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// ClusterConfig makes a profile's overall limit cluster-wide: the replicas
// that share the Redis store (and the handler and profile names) divide it
// among themselves by demand (internal/quota). No Redis call is made per
// request: each replica enforces its share, and syncs every Sync.
type ClusterConfig struct {
	// Redis names a store declared with the edgesteer_redis app (the
	// Caddyfile global option edgesteer_redis <name> { … }).
	Redis string `json:"redis"`
	// Sync is the sync interval (default 250ms).
	Sync caddy.Duration `json:"sync,omitempty"`
	// ReplicaTTL is how long a replica counts as live after its last sync
	// (default 4 × Sync): a dead replica's share returns to the others
	// within it.
	ReplicaTTL caddy.Duration `json:"replica_ttl,omitempty"`
	// Replicas is the replica count assumed until the first sync answers
	// (default 1): a replica whose store is unreachable from its start
	// enforces limit ÷ Replicas, so N replicas started while Redis is down
	// admit the limit together, not N times it.
	Replicas int `json:"replicas,omitempty"`
}

const defaultSync = 250 * time.Millisecond

// unmarshalCluster reads
//
//	cluster redis <store> {
//		sync <duration>
//		replica_ttl <duration>
//		replicas <n>
//	}
func unmarshalCluster(o *cfparse.Block) (*ClusterConfig, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	args, err := o.BlockArgs(2, 2)
	if err != nil {
		return nil, err
	}
	if args[0] != "redis" {
		return nil, o.Invalid(args[0], errors.New("want redis <store name>"))
	}
	c := &ClusterConfig{Redis: args[1]}
	for sub := o.Sub(); sub.Next(); {
		switch sub.Name() {
		case "sync":
			c.Sync, err = sub.Duration(time.Millisecond)
		case "replica_ttl":
			c.ReplicaTTL, err = sub.Duration(time.Millisecond)
		case "replicas":
			c.Replicas, err = sub.Int(1, math.MaxInt32)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// validate checks what can be checked without the Redis store.
func (c *ClusterConfig) validate(p *ProfileConfig) error {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("peer_rate_limit: profile %s: cluster %s %v: %s", p.Name, opt, v, why)
	}
	if c.Redis == "" {
		return bad("redis", `""`, "want the name of an edgesteer_redis store")
	}
	if p.Rate <= 0 {
		return bad("redis", c.Redis, "a cluster-wide limit needs the profile's overall rate (rate)")
	}
	sync := time.Duration(c.Sync)
	if sync == 0 {
		sync = defaultSync
	}
	if sync < time.Millisecond {
		return bad("sync", time.Duration(c.Sync), "must be at least 1ms")
	}
	if c.Replicas < 0 {
		return bad("replicas", c.Replicas, "must be at least 1")
	}
	if c.ReplicaTTL != 0 && time.Duration(c.ReplicaTTL) < sync {
		return bad("replica_ttl", time.Duration(c.ReplicaTTL), fmt.Sprintf("must be at least the sync interval %v", sync))
	}
	return nil
}

// replicaName is this process's identity among the replicas: host name,
// process id and a random part (two processes on one host after a pid
// wraps, or in containers sharing a host name, stay apart).
var replicaName = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
})

// clusterSpec is one generation's cluster settings of one profile.
type clusterSpec struct {
	profile string
	conn    *redisstore.Conn
	cfg     quota.Config
	overall *ratelimit.Rule // the generation's overall rule: its throttle level
	// messages are the profile's message-type limits, each cluster-wide
	// with a quota of its own (keys under <prefix>/message/<type>).
	messages []messageSpec
	logger   *zap.Logger
}

// messageSpec is one message type's cluster-wide limit.
type messageSpec struct {
	cfg  quota.Config
	rule *ratelimit.Rule // the generation's rule: its throttle level
}

// messageKeySep separates a profile's key prefix from a message type's
// part: ':' follows the prefix in a peer's key of the overall limit, so
// no peer name (client-controlled) makes the two keys collide.
const messageKeySep = "/message/"

// newClusterSpec looks the store up and builds the quota configs: the
// overall limit's and one per message type.
func newClusterSpec(ctx caddy.Context, kind, handler string, p *ProfileConfig, engine *ratelimit.Profile) (*clusterSpec, error) {
	c := p.Cluster
	if err := c.validate(p); err != nil {
		return nil, err
	}
	conn, err := redisstore.Lookup(ctx, "peer_rate_limit: profile "+p.Name+": cluster redis", c.Redis)
	if err != nil {
		return nil, err
	}
	prefix := conn.Key("peer_rate_limit", kind+"/"+handler+"/"+p.Name)
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("peer_rate_limit: profile %s: cluster key prefix %q: braces would break the Redis Cluster hash tag; remove them from key_prefix, the handler name and the profile name", p.Name, prefix)
	}
	maxPeers := p.MaxPeers
	if maxPeers == 0 {
		maxPeers = defaultMaxPeers
	}
	spec := &clusterSpec{
		profile: p.Name, conn: conn, overall: engine.Overall, logger: ctx.Logger(),
		cfg: quota.Config{
			Prefix: prefix, Replica: replicaName(), Limit: p.Rate, Burst: p.Burst,
			Interval: time.Duration(c.Sync), ReplicaTTL: time.Duration(c.ReplicaTTL), MaxPeers: maxPeers,
			ExpectedReplicas: c.Replicas,
		},
	}
	for _, m := range p.Messages {
		if strings.ContainsAny(m.Type, "{}") {
			return nil, fmt.Errorf("peer_rate_limit: profile %s: message %q: braces would break the Redis Cluster hash tag of its cluster-wide limit", p.Name, m.Type)
		}
		cfg := spec.cfg
		cfg.Prefix, cfg.Limit, cfg.Burst = prefix+messageKeySep+m.Type, m.Rate, m.Burst
		spec.messages = append(spec.messages, messageSpec{cfg: cfg, rule: engine.Message(m.Type)})
	}
	slices.SortFunc(spec.messages, func(a, b messageSpec) int { return strings.Compare(a.rule.Name, b.rule.Name) })
	return spec, nil
}

// cluster is the process state of one profile's cluster-wide limits under
// a (kind, name): the quota engines (the overall limit's and one per
// message type), the store they sync with and the sync goroutine. It
// outlives config generations (it is part of shared) and follows the
// newest generation's settings. It is the profile engines' overall
// Allower, and each message type's msgQuota is that type's: every
// generation's engine decides through the current quotas.
type cluster struct {
	handler, profile string

	q    atomic.Pointer[quota.Quota]
	spec atomic.Pointer[clusterSpec]
	// msgs are the message types' quotas (replaced whole by update; a
	// type kept by a reload keeps its *msgQuota).
	msgs atomic.Pointer[map[string]*msgQuota]
	// wake tells the sync loop that the quota or spec changed.
	wake chan struct{}

	cancel context.CancelFunc
	done   chan struct{}

	// metric handles
	syncs, malformed   prometheus.Counter
	fallbackGauge      prometheus.Gauge
	fallbackPeersGauge prometheus.Gauge
	replicasGauge      prometheus.Gauge
	clockOffsetGauge   prometheus.Gauge

	// the sync loop's own
	lastMalformed map[*quota.Quota]uint64
	lastErrors    map[*quota.Quota]map[string]uint64
	// trouble is each quota's store trouble at the last sync, as logged
	// ("" none): a log line per change.
	trouble map[*quota.Quota]string
	// clockOff: the last offset logged was past clockOffsetBound.
	clockOff bool
}

// clockOffsetBound is the offset of this replica's clock from the store's
// past which it is logged. The limiter corrects any offset (epochs and
// heartbeats follow the store's clock); past this bound the host's clock
// is farther off than NTP keeps hosts, which other things on it may not
// survive.
const clockOffsetBound = 100 * time.Millisecond

// msgQuota is one message type's cluster-wide limit: the engines'
// Allower (and Refunder) for that type.
type msgQuota struct {
	name string
	q    atomic.Pointer[quota.Quota]
	rule atomic.Pointer[ratelimit.Rule] // the newest generation's: its throttle level
}

func (m *msgQuota) Allow(key string, now int64) bool { return m.q.Load().Allow(key, now) }
func (m *msgQuota) Refund(key string, now int64)     { m.q.Load().Refund(key, now) }

// Allow decides one request under this replica's share.
func (c *cluster) Allow(key string, now int64) bool { return c.q.Load().Allow(key, now) }

// messages returns the message types' quotas, in type order.
func (c *cluster) messages() []*msgQuota {
	m := *c.msgs.Load()
	out := make([]*msgQuota, 0, len(m))
	for _, mq := range m {
		out = append(out, mq)
	}
	slices.SortFunc(out, func(a, b *msgQuota) int { return strings.Compare(a.name, b.name) })
	return out
}

func newCluster(parent context.Context, handler string, spec *clusterSpec) (*cluster, error) {
	q, err := quota.New(spec.cfg, quotaredis.New(spec.conn.Client))
	if err != nil {
		return nil, fmt.Errorf("peer_rate_limit: profile %s: cluster: %v", spec.profile, err)
	}
	c := &cluster{handler: handler, profile: spec.profile, wake: make(chan struct{}, 1), done: make(chan struct{}),
		syncs:              theMetrics.clusterSyncs.WithLabelValues(handler, spec.profile),
		malformed:          theMetrics.clusterMalformed.WithLabelValues(handler, spec.profile),
		fallbackGauge:      theMetrics.clusterFallback.WithLabelValues(handler, spec.profile),
		fallbackPeersGauge: theMetrics.clusterFallbackPeers.WithLabelValues(handler, spec.profile),
		replicasGauge:      theMetrics.clusterReplicas.WithLabelValues(handler, spec.profile),
		clockOffsetGauge:   theMetrics.clusterClockOffset.WithLabelValues(handler, spec.profile),
		lastMalformed:      map[*quota.Quota]uint64{},
		lastErrors:         map[*quota.Quota]map[string]uint64{},
		trouble:            map[*quota.Quota]string{},
	}
	c.q.Store(q)
	c.spec.Store(spec)
	c.msgs.Store(&map[string]*msgQuota{})
	if err := c.updateMessages(nil, spec); err != nil {
		return nil, err
	}
	c.replicasGauge.Set(float64(q.State().Replicas))
	ctx, cancel := context.WithCancel(parent)
	c.cancel = cancel
	go c.loop(ctx)
	return c, nil
}

// updateMessages follows spec's message types: a type whose quota config
// is unchanged keeps its quota (only the store's client may change), a
// changed one gets a new quota, a new type a new msgQuota; a type spec no
// longer has is dropped. Every new quota is made before anything changes,
// so an error leaves the cluster as it was.
func (c *cluster) updateMessages(old, spec *clusterSpec) error {
	cur := *c.msgs.Load()
	fresh := map[string]*quota.Quota{}
	for _, ms := range spec.messages {
		name := ms.rule.Name
		if cur[name] != nil && old != nil && old.messageCfg(name) == ms.cfg {
			continue
		}
		q, err := quota.New(ms.cfg, quotaredis.New(spec.conn.Client))
		if err != nil {
			return fmt.Errorf("peer_rate_limit: profile %s: message %s: cluster: %v", spec.profile, name, err)
		}
		fresh[name] = q
	}
	next := make(map[string]*msgQuota, len(spec.messages))
	for _, ms := range spec.messages {
		name := ms.rule.Name
		mq := cur[name]
		if mq == nil {
			mq = &msgQuota{name: name}
		}
		if q := fresh[name]; q != nil {
			mq.q.Store(q)
		} else if old.conn.Client != spec.conn.Client {
			mq.q.Load().SetStore(quotaredis.New(spec.conn.Client))
		}
		mq.rule.Store(ms.rule)
		next[name] = mq
	}
	c.msgs.Store(&next)
	return nil
}

// messageCfg returns the quota config of a message type, or the zero
// Config if the spec has none.
func (s *clusterSpec) messageCfg(name string) quota.Config {
	for _, m := range s.messages {
		if m.rule.Name == name {
			return m.cfg
		}
	}
	return quota.Config{}
}

// update applies a newer (or, after a failed load, the remaining newest)
// generation's settings: the same quota when its config is unchanged
// (only the store's client may differ), a new one otherwise (the shares
// start at the floor again and are proportional from the next sync).
// Nothing changes unless every new quota could be made: a spec that
// failed is tried again in full when it comes back.
func (c *cluster) update(spec *clusterSpec) error {
	old := c.spec.Load()
	var q *quota.Quota
	if old.cfg != spec.cfg {
		var err error
		if q, err = quota.New(spec.cfg, quotaredis.New(spec.conn.Client)); err != nil {
			return fmt.Errorf("peer_rate_limit: profile %s: cluster: %v", spec.profile, err)
		}
	}
	if err := c.updateMessages(old, spec); err != nil {
		return err
	}
	c.spec.Store(spec)
	if q != nil {
		c.q.Store(q)
	} else if old.conn.Client != spec.conn.Client {
		// The quota keeps its shares; only the client changes.
		c.q.Load().SetStore(quotaredis.New(spec.conn.Client))
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// stop ends the sync loop and drops the metric series.
func (c *cluster) stop() {
	c.cancel()
	<-c.done
	labels := prometheus.Labels{"handler": c.handler, "profile": c.profile}
	theMetrics.clusterSyncs.Delete(labels)
	theMetrics.clusterMalformed.Delete(labels)
	theMetrics.clusterFallback.Delete(labels)
	theMetrics.clusterFallbackPeers.Delete(labels)
	theMetrics.clusterReplicas.Delete(labels)
	theMetrics.clusterClockOffset.Delete(labels)
	theMetrics.clusterErrors.DeletePartialMatch(labels)
}

// applyThrottle gives each quota the dynamic level of its rule (0 when
// the rule is not dynamic).
func (c *cluster) applyThrottle(now time.Time) {
	q, spec := c.q.Load(), c.spec.Load()
	if pct := spec.overall.Throttle(); pct != q.State().Throttle {
		q.SetThrottle(pct, now)
	}
	for _, mq := range c.messages() {
		q := mq.q.Load()
		if pct := mq.rule.Load().Throttle(); pct != q.State().Throttle {
			q.SetThrottle(pct, now)
		}
	}
}

// loop syncs in the middle of each epoch (quota.NextSync) until stopped.
func (c *cluster) loop(ctx context.Context) {
	defer close(c.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// (Since Go 1.23, Reset leaves no stale tick in the channel.)
		timer.Reset(time.Until(c.q.Load().NextSync(time.Now())))
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			continue
		case <-timer.C:
		}
		c.syncOnce(ctx)
	}
}

// syncOnce runs one sync of the profile's quotas — the overall limit's
// and each message type's — in one pipelined round trip, and reports it
// in metrics and logs: store trouble by reason, and a log line per
// change of each quota's trouble (the store unreachable, some keys
// refused, answering again).
func (c *cluster) syncOnce(ctx context.Context) {
	q, spec := c.q.Load(), c.spec.Load()
	qs := []*quota.Quota{q}
	for _, mq := range c.messages() {
		qs = append(qs, mq.q.Load())
	}
	now := time.Now()
	c.applyThrottle(now)
	sctx, cancel := context.WithTimeout(ctx, q.Config().Interval)
	errs := quota.SyncGroup(sctx, now, qs)
	cancel()
	if ctx.Err() != nil {
		return
	}
	seen := make(map[*quota.Quota]uint64, len(qs))
	seenErrs := make(map[*quota.Quota]map[string]uint64, len(qs))
	seenTrouble := make(map[*quota.Quota]string, len(qs))
	fallback, fallbackPeers := false, 0
	for i, x := range qs {
		st := x.State()
		if last := c.lastMalformed[x]; st.Malformed > last {
			c.malformed.Add(float64(st.Malformed - last))
		}
		seen[x] = st.Malformed
		for r, n := range st.Errors {
			if last := c.lastErrors[x][r]; n > last {
				theMetrics.clusterErrors.WithLabelValues(c.handler, c.profile, r).Add(float64(n - last))
			}
		}
		seenErrs[x] = st.Errors
		fallback = fallback || st.Fallback
		fallbackPeers += st.FallbackPeers
		seenTrouble[x] = c.logTrouble(spec, x, st, errs[i])
	}
	c.lastMalformed, c.lastErrors, c.trouble = seen, seenErrs, seenTrouble
	st := q.State()
	c.replicasGauge.Set(float64(st.Replicas))
	c.fallbackPeersGauge.Set(float64(fallbackPeers))
	if st.ClockKnown {
		c.clockOffsetGauge.Set(st.ClockOffset.Seconds())
		if off := st.ClockOffset.Abs() > clockOffsetBound; off != c.clockOff {
			c.clockOff = off
			fields := []zap.Field{zap.String("profile", c.profile), zap.String("redis", spec.conn.Name),
				zap.Duration("clock_offset", st.ClockOffset), zap.Duration("measured_over_round_trip", st.ClockRTT), zap.Duration("bound", clockOffsetBound)}
			if off {
				spec.logger.Warn("this host's clock is off the cluster store's: the cluster-wide limits follow the store's clock, check NTP", fields...)
			} else {
				spec.logger.Info("this host's clock is back within the bound of the cluster store's", fields...)
			}
		}
	}
	if fallback {
		c.fallbackGauge.Set(1)
	} else {
		c.fallbackGauge.Set(0)
	}
	if errs[0] == nil {
		c.syncs.Inc()
	}
}

// maxLoggedKeys bounds the keys a log line names.
const maxLoggedKeys = 5

// logTrouble logs a change of x's store trouble and returns it: "" (none),
// "unreachable" (the whole quota on the fallback share) or "keys" (some
// peers' keys refused). A change of reason alone (a refused connection
// that becomes a timeout) is no transition: the metric counts each.
func (c *cluster) logTrouble(spec *clusterSpec, x *quota.Quota, st quota.State, err error) string {
	var now string
	switch {
	case err != nil:
		now = "unreachable"
	case st.FallbackPeers > 0:
		now = "keys"
	}
	if now == c.trouble[x] {
		return now
	}
	cfg := x.Config()
	fields := []zap.Field{zap.String("profile", c.profile), zap.String("key_prefix", cfg.Prefix), zap.String("redis", spec.conn.Name),
		zap.Int("replicas", st.Replicas), zap.Float64("fallback_share_per_second", st.Effective/float64(st.Replicas))}
	switch {
	case err != nil:
		spec.logger.Warn("cluster store unreachable: enforcing the fallback share, limit ÷ last known replicas",
			append(fields, zap.String("reason", st.LastReason), zap.Error(err))...)
	case now != "":
		troubles := x.Troubles(0)
		var reasons, keys []string
		for _, t := range troubles {
			if !slices.Contains(reasons, t.Reason) {
				reasons = append(reasons, t.Reason)
			}
			if len(keys) < maxLoggedKeys {
				keys = append(keys, t.Key+" ("+t.Reason+": "+t.Error+")")
			}
		}
		slices.Sort(reasons)
		spec.logger.Warn("cluster store refused some keys: their peers get the fallback share, limit ÷ last known replicas",
			append(fields, zap.Int("peers_in_fallback", st.FallbackPeers), zap.Strings("reasons", reasons),
				zap.Strings("keys", keys))...)
	default:
		spec.logger.Info("cluster store answering again for every key: shares resynced", fields...)
	}
	return now
}

// reconcileClusters follows the attached generations (newest last): every
// profile with a cluster block in the newest generation that has it gets
// its cluster, updated to that generation's settings; a profile that no
// attached generation limits cluster-wide any more has its cluster
// stopped. The engines of gens get the cluster as their overall Allower.
func (sh *shared) reconcileClusters(gens []*generation) error {
	newest := map[string]*clusterSpec{}
	for _, g := range gens {
		for _, s := range g.clusters {
			newest[s.profile] = s
		}
	}
	var errs []error
	for name, spec := range newest {
		c := sh.clusters[name]
		if c == nil {
			var err error
			if c, err = newCluster(sh.ctx, sh.name, spec); err != nil {
				errs = append(errs, err)
				continue
			}
			sh.clusters[name] = c
		} else if err := c.update(spec); err != nil {
			errs = append(errs, err)
			continue
		}
	}
	for name, c := range sh.clusters {
		if newest[name] == nil {
			c.stop()
			delete(sh.clusters, name)
		}
	}
	for _, g := range gens {
		for _, e := range g.engines {
			// An engine in use already has its cluster (the same one for
			// as long as a generation has it): only new engines are set.
			if c := sh.clusters[e.Name]; c != nil && g.hasCluster(e.Name) && e.Global() == nil {
				for _, mq := range c.messages() {
					if e.Message(mq.name) != nil {
						e.SetMessageGlobal(mq.name, mq)
					}
				}
				e.SetGlobal(c)
			}
		}
	}
	return errors.Join(errs...)
}

// hasCluster reports whether the generation limits profile cluster-wide.
func (g *generation) hasCluster(profile string) bool {
	for _, s := range g.clusters {
		if s.profile == profile {
			return true
		}
	}
	return false
}

// applyClusterThrottle passes a new dynamic level on at once (the sync
// loop would at its next sync).
func (sh *shared) applyClusterThrottle() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := time.Now()
	for _, c := range sh.clusters {
		c.applyThrottle(now)
	}
}

// clusterOf returns the profile's cluster, if any.
func (sh *shared) clusterOf(profile string) *cluster {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.clusters[profile]
}
