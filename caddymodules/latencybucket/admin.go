package latencybucket

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	"github.com/edgesteer/edgesteer/internal/orca"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("latency_bucket", func() any { return policyViews() })
}

// Admin is the admin API endpoint GET /latency_bucket/: every live
// latency_bucket policy state's publishers with latency, bucket, active state,
// last probe error and sticky-entry count (Netskope's "View Publisher
// Latency Details").
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.latency_bucket",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/latency_bucket/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// PolicyView is one policy in the admin API's answer.
type PolicyView struct {
	Name          string    `json:"name"`
	Kind          string    `json:"kind"`
	StateSince    time.Time `json:"state_since"`
	Generations   int       `json:"generations"` // policies of loaded configs holding the state
	BucketWidthMS float64   `json:"bucket_width_ms"`
	Latency       string    `json:"latency"` // probe, traffic, both or off
	// TrafficHalfLifeMS is the observed latency's half-life in force.
	TrafficHalfLifeMS float64 `json:"traffic_half_life_ms"`
	ProbeWindow       int     `json:"probe_window"`
	Sticky            bool    `json:"sticky"`
	StickyEntries     int     `json:"sticky_entries"`
	StickyMaxEntries  int     `json:"sticky_max_entries"`
	// StickyStore is the shared level of the sticky table (sticky_store);
	// absent without one.
	StickyStore *StoreView `json:"sticky_store,omitempty"`
	// Within is the pick inside the lowest bucket; SlowStartMS the slow
	// start window (0: off), of the latest config holding the state.
	Within      string  `json:"within"`
	SlowStartMS float64 `json:"slow_start_ms"`
	// ORCA is the backends' load reports (within p2c, HTTP); absent when
	// they are not read.
	ORCA       *ORCAView       `json:"orca,omitempty"`
	Publishers []PublisherView `json:"publishers"`
}

// ORCAView is how the policy reads backends' endpoint-load-metrics
// headers, and what came of them: counts since the state was made.
type ORCAView struct {
	BlackoutMS   float64 `json:"blackout_ms"`
	ExpirationMS float64 `json:"expiration_ms"`
	Absent       uint64  `json:"absent"` // answers without the header
	// Reports counts headers by outcome: "ok" taken, else the reason it
	// was ignored (too_long, syntax, bad_number, no_utilization…).
	Reports map[string]uint64 `json:"reports"`
}

// StoreView is the shared sticky store as the policy sees it. The counts
// are cumulative since the state was made (kept across reloads).
type StoreView struct {
	Store       string    `json:"store"`      // "redis <name>"
	KeyPrefix   string    `json:"key_prefix"` // every pair's key starts with it
	TimeoutMS   float64   `json:"timeout_ms"`
	Healthy     bool      `json:"healthy"`
	DownSince   time.Time `json:"down_since,omitzero"`
	Failing     int       `json:"failing"` // calls in a row without an answer
	LastError   string    `json:"last_error,omitempty"`
	LastReason  string    `json:"last_reason,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Refusing: Redis answered an error reply (NOPERM, READONLY, OOM…)
	// for some key in the last 10 s; the last such key, and why.
	Refusing      bool      `json:"refusing"`
	RefusingSince time.Time `json:"refusing_since,omitzero"`
	RefusedKey    string    `json:"refused_key,omitempty"`
	RefusedReason string    `json:"refused_reason,omitempty"`
	RefusedAt     time.Time `json:"refused_at,omitzero"`
	HitsLocal     uint64    `json:"hits_local"`
	HitsRedis     uint64    `json:"hits_redis"`
	Misses        uint64    `json:"misses"`
	Stale         uint64    `json:"stale"`
	Malformed     uint64    `json:"malformed"`
	Errors        uint64    `json:"errors"`
	// ErrorsByReason splits Errors by redisconn.Reason's word.
	ErrorsByReason map[string]uint64 `json:"errors_by_reason"`
	Skipped        uint64            `json:"skipped"`
	Writes         uint64            `json:"writes"`
	Adopted        uint64            `json:"adopted"`
	Refreshes      uint64            `json:"refreshes"`
	// Pins made locally without Redis' word (a call failed or Redis was
	// unreachable), awaiting reconciliation; and those reconciled: kept
	// (written, or Redis already had them) or switched to another
	// replica's pin.
	Pending          int    `json:"pending"`
	Reconciled       uint64 `json:"reconciled"`
	ReconcileAdopted uint64 `json:"reconcile_adopted"`
	PendingDropped   uint64 `json:"pending_dropped"`
}

// PublisherView is one publisher in the admin API's answer.
type PublisherView struct {
	Address   string  `json:"address"`
	LatencyMS float64 `json:"latency_ms"`
	// ProbeLatencyMS is probed_ms + segment_ms; ObservedMS and
	// ObservedPeakMS the observed latency of real traffic (average and
	// peak-EWMA) over ObservedSamples counted samples; DecidedBy which
	// figure latency_ms (and so the bucket) is: "probe" or "traffic".
	ProbeLatencyMS  float64   `json:"probe_latency_ms"`
	ObservedMS      float64   `json:"observed_ms"`
	ObservedPeakMS  float64   `json:"observed_peak_ms"`
	ObservedSamples uint64    `json:"observed_samples"`
	DecidedBy       string    `json:"decided_by,omitempty"`
	ProbedMS        float64   `json:"probed_ms"`
	SegmentMS       float64   `json:"segment_ms"`
	Bucket          string    `json:"bucket"`
	Measured        bool      `json:"measured"`
	Active          bool      `json:"active"`
	WindowRounds    int       `json:"window_rounds"`
	LastRTTsMS      []float64 `json:"last_rtts_ms"`
	LastError       string    `json:"last_error,omitempty"`
	LastProbe       time.Time `json:"last_probe,omitzero"`
	Rounds          uint64    `json:"probe_rounds"`
	StickyEntries   int       `json:"sticky_entries"`
	PicksTotal      uint64    `json:"picks_total"`
	// InFlight is the requests (HTTP, counted by the latency_bucket
	// transport) or connections (layer 4, from connect to the end of the
	// upstream side) in flight to it now; EstimateMS the latency a p2c
	// pick expects of it (observed EWMA once traffic is counted, else the
	// probe latency); ObservedInFlight the mean in flight its counted
	// requests began with, themselves included (1 before any);
	// PerRequestMS = estimate ÷ that; CostMS = per request × (in flight
	// + 1) × load factor, what p2c compares.
	InFlight         int64   `json:"in_flight"`
	EstimateMS       float64 `json:"estimate_ms"`
	ObservedInFlight float64 `json:"observed_in_flight"`
	PerRequestMS     float64 `json:"per_request_ms"`
	CostMS           float64 `json:"cost_ms"`
	// LoadFactor multiplies the cost: 1 / (1 − min(u, 0.95)) of a fresh
	// ORCA report's utilization u, else 1. ORCAState is none, blackout,
	// fresh or expired; ORCAUtilization the latest report's utilization
	// (application_utilization if above 0, else cpu_utilization) and
	// ORCAAgeMS its age (both 0 with state none).
	LoadFactor      float64 `json:"load_factor"`
	ORCAState       string  `json:"orca_state"`
	ORCAUtilization float64 `json:"orca_utilization"`
	ORCAAgeMS       float64 `json:"orca_age_ms"`
	// SlowStart is true while the publisher is in slow start, and
	// SlowStartProgress how far through it is (0 to 1; 1 when not).
	SlowStart         bool    `json:"slow_start"`
	SlowStartProgress float64 `json:"slow_start_progress"`
}

// latencyWord is the latency option in force, as the admin view names it.
func latencyWord(cfg pubsel.Config) string {
	switch {
	case cfg.NoBuckets:
		return "off"
	case cfg.Source == pubsel.FromTraffic:
		return "traffic"
	case cfg.Source == pubsel.FromBoth:
		return "both"
	}
	return "probe"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var serveAdmin = views.Handler(policyViews)

// policyViews is the admin API's answer (and the dashboard's).
func policyViews() []PolicyView {
	now := time.Now().UnixNano()
	views := []PolicyView{}
	picksByName := allPicks()
	for _, p := range pooledStates() {
		s := p.Settings()
		cfg := p.Tracker().Config()
		v := PolicyView{Name: p.key.name, Kind: p.key.kind, StateSince: p.Since(), Generations: p.Leases(),
			BucketWidthMS: ms(cfg.BucketWidth), Latency: latencyWord(cfg), ProbeWindow: cfg.Window, Sticky: s.Sticky,
			TrafficHalfLifeMS: ms(cfg.HalfLife), Within: p.within(), SlowStartMS: ms(p.slowStart())}
		if cfg.ORCA {
			v.ORCA = orcaView(p.Tracker(), cfg)
		}
		byAddr, sticky := picksByName[p.key.name].Totals()
		var counts map[uint32]int
		if s.Sticky {
			v.StickyMaxEntries = p.Table().Max()
			counts = p.Table().Counts(now)
			for _, n := range counts {
				v.StickyEntries += n
			}
		}
		if sh := p.StickyStore(); sh != nil {
			v.StickyStore = storeView(sh.Health(), p.StickyStoreStats(), sticky)
		}
		for _, st := range p.Tracker().Statuses() {
			pv := PublisherView{
				Address: st.Addr, LatencyMS: ms(st.Latency), ProbedMS: ms(st.Probed), SegmentMS: ms(st.Segment),
				ProbeLatencyMS: ms(st.ProbeLatency), ObservedMS: ms(st.Observed), ObservedPeakMS: ms(st.ObservedPeak),
				ObservedSamples: st.ObservedSamples, DecidedBy: st.DecidedBy,
				Bucket: st.Label, Measured: st.Measured, Active: st.Active, WindowRounds: st.Window, LastError: st.LastError,
				LastProbe: st.LastProbe, Rounds: st.Rounds, StickyEntries: counts[st.ID], LastRTTsMS: []float64{},
				PicksTotal: byAddr[st.Addr],
			}
			l := p.Tracker().LoadOf(st.ID, p.Now())
			pv.InFlight, pv.EstimateMS, pv.PerRequestMS, pv.CostMS, pv.LoadFactor = l.InFlight, ms(l.Estimate), ms(l.PerRequest), ms(l.Cost), l.Factor
			pv.ObservedInFlight = max(st.ObservedInFlight, 1)
			pv.ORCAState, pv.ORCAUtilization, pv.ORCAAgeMS = l.ORCA.State.String(), l.ORCA.Utilization, ms(l.ORCA.Age)
			pv.SlowStart, pv.SlowStartProgress = l.Warming, slowStartProgress(l)
			for _, d := range st.LastRTTs {
				pv.LastRTTsMS = append(pv.LastRTTsMS, ms(d))
			}
			v.Publishers = append(v.Publishers, pv)
		}
		views = append(views, v)
	}
	return views
}

func orcaView(tr *pubsel.Tracker, cfg pubsel.Config) *ORCAView {
	absent, by := tr.LoadReports()
	v := &ORCAView{BlackoutMS: ms(cfg.ORCAPeriods.Blackout), ExpirationMS: ms(cfg.ORCAPeriods.Expiration),
		Absent: absent, Reports: map[string]uint64{}}
	for r, n := range by {
		if n > 0 {
			v.Reports[orca.Reason(r).String()] = n
		}
	}
	return v
}

// slowStartProgress is l's progress through slow start: 1 when not in it.
func slowStartProgress(l pubsel.Load) float64 {
	if l.Warming {
		return l.SlowStart
	}
	return 1
}

func storeView(h pubsel.StickyStoreHealth, s *pubsel.StickyStoreStats, stickyPicks uint64) *StoreView {
	return &StoreView{
		Store: h.Name, KeyPrefix: h.Prefix, TimeoutMS: ms(h.Timeout), Healthy: h.Healthy, DownSince: h.DownSince,
		Failing: h.Failing, LastError: h.LastError, LastReason: h.LastReason, LastErrorAt: h.ErrorAt,
		Refusing: h.Refusing, RefusingSince: h.RefusingSince, RefusedKey: h.RefusedKey, RefusedReason: h.RefusedReason,
		RefusedAt: h.RefusedAt, ErrorsByReason: s.ErrorsByReason(), Pending: s.Pending(), Reconciled: s.Reconciled.Load(),
		ReconcileAdopted: s.ReconcileAdopted.Load(), PendingDropped: s.PendingDropped.Load(),
		HitsLocal: localHits(stickyPicks, s), HitsRedis: s.StoreHits.Load(), Misses: s.Misses.Load(), Stale: s.Stale.Load(),
		Malformed: s.Malformed.Load(), Errors: s.Errors.Load(), Skipped: s.Skipped.Load(), Writes: s.Writes.Load(),
		Adopted: s.Adopted.Load(), Refreshes: s.Refreshes.Load(),
	}
}

// localHits is the pinned picks the local table answered: the sticky
// decisions (counted on the request path in the policy's picks already,
// so a local hit pays for no second count) less those the store answered.
func localHits(stickyPicks uint64, s *pubsel.StickyStoreStats) uint64 {
	return stickyPicks - min(stickyPicks, s.StoreHits.Load())
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
