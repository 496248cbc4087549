package peerratelimit

import (
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	"github.com/edgesteer/edgesteer/internal/quota"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("peer_rate_limit", func() any { return handlerViews() })
}

// Admin is the admin API endpoint GET /peer_rate_limit/: every live
// peer_rate_limit handler's profiles with configured and effective limits,
// the keys they track, and the live dynamic throttle level.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.peer_rate_limit",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/peer_rate_limit/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// HandlerView is one handler in the admin API's answer.
type HandlerView struct {
	Name     string        `json:"name"`
	Kind     string        `json:"kind"`
	Profiles []ProfileView `json:"profiles"`
	Dynamic  *DynamicView  `json:"dynamic,omitempty"`
}

// ProfileView is one profile.
type ProfileView struct {
	Name   string     `json:"name"`
	Keys   int        `json:"keys"`
	Limits []RuleView `json:"limits"`
	// Decisions since the state was made (they survive reloads), all
	// message types together; a dashboard derives rates from them.
	AdmittedTotal uint64 `json:"admitted_total"`
	RejectedTotal uint64 `json:"rejected_total"`
	DroppedTotal  uint64 `json:"dropped_total"`
	// Cluster is the state of the cluster-wide overall limit, if any.
	Cluster *ClusterView `json:"cluster,omitempty"`
}

// ClusterView is this replica's side of a cluster-wide limit.
type ClusterView struct {
	Redis        string `json:"redis"`   // the edgesteer_redis store's name
	Replica      string `json:"replica"` // this replica's identity
	ReplicasSeen int    `json:"replicas_seen"`
	// ReplicasReserved are the other live replicas counted at their
	// fallback share at the last sync; Reserving: this replica's
	// heartbeat says it is at the fallback share for some peer.
	ReplicasReserved int   `json:"replicas_reserved"`
	Reserving        bool  `json:"reserving"`
	SyncIntervalMs   int64 `json:"sync_interval_ms"`
	// ClockOffsetMs is this replica's clock minus the store's (Redis
	// TIME), measured over a round trip of ClockRTTMs; nil before the
	// first measure.
	ClockOffsetMs   *float64  `json:"clock_offset_ms"`
	ClockRTTMs      *float64  `json:"clock_rtt_ms"`
	LastSync        time.Time `json:"last_sync,omitzero"`
	LastAttempt     time.Time `json:"last_attempt,omitzero"`
	RedisHealthy    bool      `json:"redis_healthy"`
	LastError       string    `json:"last_error,omitempty"`
	LastErrorReason string    `json:"last_error_reason,omitempty"`
	SyncErrors      uint64    `json:"sync_errors_total"`
	// ErrorsByReason counts store trouble (a failed sync, or a key a sync
	// could not read or write) by reason.
	ErrorsByReason map[string]uint64 `json:"errors_by_reason"`
	// The overall limit's quota.
	ClusterLimitView
	// Messages are the profile's message-type limits, each cluster-wide
	// too (synced in the same round trip), in type order.
	Messages []ClusterMessageView `json:"messages"`
}

// ClusterMessageView is this replica's side of one message type's
// cluster-wide limit.
type ClusterMessageView struct {
	Type string `json:"type"`
	ClusterLimitView
}

// ClusterLimitView is one cluster-wide limit's quota on this replica: the
// overall limit's and each message type's have the same fields.
type ClusterLimitView struct {
	KeyPrefix          string        `json:"key_prefix"` // the keys' namespace in Redis
	Fallback           bool          `json:"fallback"`
	FallbackPeers      int           `json:"fallback_peers"`
	StoreTrouble       []TroubleView `json:"store_trouble"`
	Malformed          uint64        `json:"malformed_total"`
	RepairedTotal      uint64        `json:"repaired_total"`
	LimitPerSecond     float64       `json:"limit_per_second"`
	EffectivePerSecond float64       `json:"effective_limit_per_second"`
	ThrottlePercent    int           `json:"throttle_percent"`
	PeersTracked       int           `json:"peers_tracked"`
	OverflowedTotal    uint64        `json:"overflowed_total"`
	// Shares are the largest local shares, at most maxShareViews.
	Shares []ShareView `json:"shares"`
}

func limitView(q *quota.Quota, st quota.State) ClusterLimitView {
	v := ClusterLimitView{KeyPrefix: q.Config().Prefix, Fallback: st.Fallback, FallbackPeers: st.FallbackPeers,
		StoreTrouble: troubleViews(q), Malformed: st.Malformed, RepairedTotal: st.Repaired,
		LimitPerSecond: st.Limit, EffectivePerSecond: st.Effective, ThrottlePercent: st.Throttle,
		PeersTracked: st.Peers, OverflowedTotal: st.Overflowed, Shares: []ShareView{}}
	for _, s := range q.Shares(maxShareViews) {
		v.Shares = append(v.Shares, ShareView{Peer: s.Peer, SharePerSecond: s.Share, SharePercent: 100 * s.Fraction, StoreTrouble: s.Trouble})
	}
	return v
}

// ShareView is this replica's share of one peer's cluster-wide limit.
type ShareView struct {
	Peer           string  `json:"peer"`
	SharePerSecond float64 `json:"share_per_second"`
	SharePercent   float64 `json:"share_percent"` // of the effective cluster-wide limit
	// StoreTrouble is why the share is the fallback share, if the store
	// refused the peer's keys at the last sync.
	StoreTrouble string `json:"store_trouble,omitempty"`
}

// TroubleView is one peer whose keys the store could not read or write
// at the last sync: its share is the fallback share.
type TroubleView struct {
	Peer   string    `json:"peer"`
	Key    string    `json:"key"`
	Reason string    `json:"reason"`
	Error  string    `json:"error"`
	Since  time.Time `json:"since"`
}

func troubleViews(q *quota.Quota) []TroubleView {
	out := []TroubleView{}
	for _, t := range q.Troubles(maxShareViews) {
		out = append(out, TroubleView{Peer: t.Peer, Key: t.Key, Reason: t.Reason, Error: t.Error, Since: t.Since})
	}
	return out
}

// maxShareViews bounds the shares listed per profile (peers are
// client-controlled: the view must not grow with them).
const maxShareViews = 20

// RuleView is one limit.
type RuleView struct {
	Name            string  `json:"name"` // "overall" or the message type
	Rate            float64 `json:"rate_per_second"`
	Burst           int     `json:"burst"`
	ThrottlePercent int     `json:"throttle_percent"`
	Effective       float64 `json:"effective_rate_per_second"`
	// EffectiveBurst is the burst at the effective rate.
	EffectiveBurst int `json:"effective_burst"`
}

// DynamicView is the dynamic controller's state.
type DynamicView struct {
	Source          string    `json:"source"`
	LoadPercent     float64   `json:"load_percent"`
	SampledAt       time.Time `json:"sampled_at,omitzero"`
	ThrottlePercent int       `json:"throttle_percent"`
	// ReversalSince is when the load went below the reversal threshold:
	// the hold in progress ends at ReversalSince + reversal_hold.
	ReversalSince time.Time `json:"reversal_since,omitzero"`
	LastError     string    `json:"last_error,omitempty"`
	// ORCA is the orca source's state.
	ORCA *ORCAView `json:"orca,omitempty"`
}

var serveAdmin = views.Handler(handlerViews)

// handlerViews is the admin API's answer (and the dashboard's).
func handlerViews() []HandlerView {
	views := []HandlerView{}
	counts := decisionCounts()
	for _, hs := range registry.List(func(hs *handlerState) string { return hs.name + "\x00" + hs.kind }) {
		g := hs.newest()
		if g == nil {
			continue
		}
		v := HandlerView{Name: hs.name, Kind: hs.kind}
		for _, e := range g.engines {
			t := profileTotals(counts, hs.name, e.Name)
			pv := ProfileView{Name: e.Name, Keys: e.Keys(), AdmittedTotal: t[admitted], RejectedTotal: t[rejected], DroppedTotal: t[dropped]}
			if c := hs.clusterOf(e.Name); c != nil {
				pv.Cluster = c.view()
			}
			for _, rule := range e.Rules() {
				pv.Limits = append(pv.Limits, RuleView{Name: rule.Name, Rate: rule.Rate, Burst: rule.Burst,
					ThrottlePercent: rule.Throttle(), Effective: rule.Effective(), EffectiveBurst: rule.EffectiveBurst()})
			}
			slices.SortFunc(pv.Limits, func(a, b RuleView) int { return strings.Compare(a.Name, b.Name) })
			v.Profiles = append(v.Profiles, pv)
		}
		if active, _ := hs.store.Active().(*generation); active != nil && active.dynamic != nil {
			st, _ := hs.store.Controller()
			v.Dynamic = &DynamicView{Source: active.dynamic.src.String(), LoadPercent: st.Load, SampledAt: st.SampledAt,
				ThrottlePercent: st.Throttle, ReversalSince: st.ReversalSince, LastError: active.dynamic.lastError()}
			if f := active.dynamic.orca; f != nil {
				v.Dynamic.ORCA = f.view(active.dynamic.src)
			}
		}
		views = append(views, v)
	}
	return views
}

// Interface guards
var _ caddy.AdminRouter = Admin{}

// view is the cluster's state for the admin API.
func (c *cluster) view() *ClusterView {
	q, spec := c.q.Load(), c.spec.Load()
	st, cfg := q.State(), q.Config()
	v := &ClusterView{Redis: spec.conn.Name, Replica: st.Replica, ReplicasSeen: st.Replicas,
		ReplicasReserved: st.Reserved, Reserving: st.Reserving,
		SyncIntervalMs: cfg.Interval.Milliseconds(), LastSync: st.LastSync, LastAttempt: st.LastAttempt,
		RedisHealthy: st.Healthy, LastError: st.LastError, LastErrorReason: st.LastReason, SyncErrors: st.StoreErrors,
		ErrorsByReason: st.Errors, ClusterLimitView: limitView(q, st), Messages: []ClusterMessageView{}}
	if st.ClockKnown {
		off, rtt := float64(st.ClockOffset.Microseconds())/1000, float64(st.ClockRTT.Microseconds())/1000
		v.ClockOffsetMs, v.ClockRTTMs = &off, &rtt
	}
	for _, mq := range c.messages() {
		q := mq.q.Load()
		v.Messages = append(v.Messages, ClusterMessageView{Type: mq.name, ClusterLimitView: limitView(q, q.State())})
	}
	return v
}

// profileTotals sums counts (decisionCounts) over message types: the
// decisions of handler's profile by verdict, the view's totals. Like the
// metric's series, they are by handler name, whatever its kind.
func profileTotals(counts map[decisionKey][3]uint64, handler, profile string) [3]uint64 {
	var out [3]uint64
	for k, n := range counts {
		if k.handler == handler && k.profile == profile {
			for v := range out {
				out[v] += n[v]
			}
		}
	}
	return out
}
