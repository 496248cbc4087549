package peerratelimit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/quotaredis"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// cluster is the process state of one profile's cluster-wide limits under
// a (kind, name): the quota engines (the overall limit's and one per
// message type), the store they sync with and the sync goroutine. It
// outlives config generations (it is part of handlerState) and follows the
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
	// trouble is each quota's store trouble as logged: a log line per
	// change.
	trouble map[*quota.Quota]troubleLog
	// clockOff: the last offset logged was past clockOffsetBound.
	clockOff bool
	// keepAlive writes the heartbeat alone while the syncs fail.
	keepAlive keepAlive
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
		trouble:            map[*quota.Quota]troubleLog{},
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

// stop ends the sync loop and drops the metric series.
func (c *cluster) stop() {
	c.cancel()
	<-c.done
	c.keepAlive.stop()
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
		timer.Reset(time.Until(c.q.Load().NextSync(monoclock.Now())))
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
	c.warmKeepAlive(ctx)
	now := monoclock.Now()
	c.applyThrottle(now)
	sctx, cancel := context.WithTimeout(ctx, q.Config().Interval)
	errs := quota.SyncGroup(sctx, now, qs)
	cancel()

	if ctx.Err() != nil {
		return
	}
	seen := make(map[*quota.Quota]uint64, len(qs))
	seenErrs := make(map[*quota.Quota]map[string]uint64, len(qs))
	seenTrouble := make(map[*quota.Quota]troubleLog, len(qs))
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
	} else {
		c.startKeepAlive(ctx)
	}
}

// maxLoggedKeys bounds the keys a log line names.
const maxLoggedKeys = 5

// troubleLog is a quota's store trouble as the log said it: the store
// unreachable (the last sync failed as a whole), and some peers' keys
// refused (by the last sync the store answered: a failed sync says
// nothing new of them, and the engine keeps their trouble through it).
type troubleLog struct{ unreachable, keys bool }

// logTrouble logs a change of x's store trouble and returns it. A change
// of reason alone (a refused connection that becomes a timeout) is no
// transition: the metric counts each.
func (c *cluster) logTrouble(spec *clusterSpec, x *quota.Quota, st quota.State, err error) troubleLog {
	was := c.trouble[x]
	now := troubleLog{unreachable: true, keys: was.keys}
	if err == nil {
		now = troubleLog{keys: st.FallbackPeers > 0}
	}
	if now == was {
		return now
	}
	cfg := x.Config()
	fields := []zap.Field{zap.String("profile", c.profile), zap.String("key_prefix", cfg.Prefix), zap.String("redis", spec.conn.Name),
		zap.Int("replicas", st.Replicas), zap.Float64("fallback_share_per_second", st.Effective/float64(st.Replicas))}
	switch {
	case err != nil:
		spec.logger.Warn("cluster store unreachable: enforcing the fallback share, limit ÷ last known replicas",
			append(fields, zap.String("reason", st.LastReason), zap.Error(err))...)
	case now.keys && was.keys:
		// Back from an outage that began while some keys were refused,
		// and they still are: the refusal was logged when it began.
		spec.logger.Info("cluster store answering again, still refusing the keys logged before: their peers keep the fallback share",
			append(fields, zap.Int("peers_in_fallback", st.FallbackPeers))...)
	case now.keys:
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
