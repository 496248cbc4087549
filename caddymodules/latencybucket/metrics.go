package latencybucket

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/orca"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

const metricsPrefix = "caddy_edgesteer_latency_bucket_"

type metrics struct {
	probeRTT      *prometheus.HistogramVec
	probeFailures *prometheus.CounterVec
	state         stateCollector
	selections    selectionsCollector
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

// registerMetrics registers the collectors, created once per process, with
// this config's registry (a reload registers them again; that is no error).
func registerMetrics(ctx caddy.Context) (*metrics, error) {
	metricsOnce.Do(func() {
		theMetrics = &metrics{
			probeRTT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name:    metricsPrefix + "probe_rtt_seconds",
				Help:    "Round-trip time of successful publisher probes.",
				Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms … 4 s
			}, []string{"policy", "publisher"}),
			probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: metricsPrefix + "probe_failures_total",
				Help: "Failed publisher probes.",
			}, []string{"policy", "publisher"}),
		}
	})
	err := metricsreg.Register(ctx, &theMetrics.selections, theMetrics.probeRTT, theMetrics.probeFailures, &theMetrics.state)
	return theMetrics, err
}

func (m *metrics) observeRound(policy, addr string, r latency.Result) {
	for _, rtt := range r.RTTs {
		if rtt == 0 {
			m.probeFailures.WithLabelValues(policy, addr).Inc()
			continue
		}
		m.probeRTT.WithLabelValues(policy, addr).Observe(rtt.Seconds())
	}
}

// selectionsCollector reports the pick counts of every policy name used
// so far (picks), kept by the engine (pubsel.Picks) for the admin view too.
type selectionsCollector struct{}

var descSelections = prometheus.NewDesc(metricsPrefix+"selections_total",
	"Publisher selections by policy, publisher, latency bucket and decision (new pick or sticky).",
	[]string{"policy", "publisher", "bucket", "decision"}, nil)

func (*selectionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descSelections }

func (*selectionsCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range allPicks() {
		for _, c := range p.Counts() {
			ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(descSelections, prometheus.CounterValue, float64(c.N),
				c.Created, name, c.Addr, c.Label, decisionWord(pubsel.Decision{Sticky: c.Sticky}))
		}
	}
}

// stateCollector reports every live policy state's publishers at scrape
// time. It is registered with each config generation's registry (Caddy
// makes one per load) and reads the process-level pool, so the gauges show
// the adopted state after a reload.
type stateCollector struct{}

var (
	descLatency = prometheus.NewDesc(metricsPrefix+"publisher_latency_seconds",
		"Publisher latency the bucket is computed from: with latency probe the probe minimum over the window plus the static segment; with traffic or both see the observed latency.", []string{"policy", "publisher"}, nil)
	descObserved = prometheus.NewDesc(metricsPrefix+"publisher_observed_latency_seconds",
		"Latency observed on real traffic (HTTP: time to response headers; layer4: connect time), as a moving average (stat avg) and a peak-EWMA (stat peak).",
		[]string{"policy", "publisher", "stat"}, nil)
	descActive = prometheus.NewDesc(metricsPrefix+"publisher_active",
		"1 if the publisher's last probe round had a success.", []string{"policy", "publisher"}, nil)
	descBucket = prometheus.NewDesc(metricsPrefix+"publisher_bucket",
		"Index of the publisher's latency bucket (0 is [0,w)); -1 unmeasured.", []string{"policy", "publisher"}, nil)
	// The pick's load figures (within p2c reads them; shown whatever within is).
	descInFlight = prometheus.NewDesc(metricsPrefix+"publisher_in_flight",
		"Requests (HTTP) or connections (layer4) in flight to the publisher, as within p2c counts them.", []string{"policy", "publisher"}, nil)
	descCost = prometheus.NewDesc(metricsPrefix+"publisher_cost_seconds",
		"What within p2c compares: latency per request (estimate ÷ mean in flight at its requests' start) × (in flight + 1) × load factor.", []string{"policy", "publisher"}, nil)
	descLoadFactor = prometheus.NewDesc(metricsPrefix+"publisher_load_factor",
		"1 / (1 − min(u, 0.95)) of the publisher's fresh ORCA utilization u, else 1.", []string{"policy", "publisher"}, nil)
	descORCAUtil = prometheus.NewDesc(metricsPrefix+"publisher_orca_utilization",
		"Utilization of the publisher's latest ORCA report, by its state (blackout, fresh, expired); absent before any.",
		[]string{"policy", "publisher", "state"}, nil)
	descORCAAge = prometheus.NewDesc(metricsPrefix+"publisher_orca_age_seconds",
		"Age of the publisher's latest ORCA report; absent before any.", []string{"policy", "publisher"}, nil)
	descORCAReports = prometheus.NewDesc(metricsPrefix+"orca_reports_total",
		"Answers' endpoint-load-metrics headers by outcome: ok (taken), absent, or the reason it was ignored (too_long, syntax, bad_number…).",
		[]string{"policy", "reason"}, nil)
	descSlowStart = prometheus.NewDesc(metricsPrefix+"publisher_slow_start_progress",
		"How far the publisher is through its slow start, 0 to 1 (1: not in slow start, full share).", []string{"policy", "publisher"}, nil)
	descSticky = prometheus.NewDesc(metricsPrefix+"sticky_entries",
		"Entries in the policy's sticky table.", []string{"policy"}, nil)

	// The shared sticky store (sticky_store), per policy.
	descStoreHits = prometheus.NewDesc(metricsPrefix+"store_hits_total",
		"Pinned picks answered by the local sticky table (level local, no store call) or, on a local miss, by the shared store (level redis).",
		[]string{"policy", "level"}, nil)
	descStoreMisses = prometheus.NewDesc(metricsPrefix+"store_misses_total",
		"Local misses the shared store had no entry for: a new pick, written to the store.", []string{"policy"}, nil)
	descStoreStale = prometheus.NewDesc(metricsPrefix+"store_stale_total",
		"Store entries naming a publisher inactive or unavailable here: re-picked and rewritten.", []string{"policy"}, nil)
	descStoreErrors = prometheus.NewDesc(metricsPrefix+"store_errors_total",
		"Store calls that failed or timed out (the pick went on locally), by reason (noperm, timeout, refused…).",
		[]string{"policy", "reason"}, nil)
	descStoreRefusing = prometheus.NewDesc(metricsPrefix+"store_refusing",
		"1 while the shared sticky store refuses some keys (an error reply in the last 10 s), else 0.", []string{"policy"}, nil)
	descStorePending = prometheus.NewDesc(metricsPrefix+"store_pending",
		"Pins made locally without the store's word, awaiting reconciliation.", []string{"policy"}, nil)
	descStoreReconciled = prometheus.NewDesc(metricsPrefix+"store_reconciled_total",
		"Local pins reconciled with the store: kept (written, or already there) or adopted (another replica's pin followed).",
		[]string{"policy", "outcome"}, nil)
	descStoreMalformed = prometheus.NewDesc(metricsPrefix+"store_malformed_total",
		"Store values ignored: not one of the policy's publishers, too long, not printable, or a key of another type.", []string{"policy"}, nil)
	descStoreSkipped = prometheus.NewDesc(metricsPrefix+"store_skipped_total",
		"Store calls not made because the store is known to be down.", []string{"policy"}, nil)
	descStoreWrites = prometheus.NewDesc(metricsPrefix+"store_writes_total",
		"New pins written to the store.", []string{"policy"}, nil)
	descStoreRefreshes = prometheus.NewDesc(metricsPrefix+"store_refreshes_total",
		"Store entries renewed (off the request path) for pairs in use from the local table, once per half sticky_ttl.", []string{"policy"}, nil)
	descStoreHealthy = prometheus.NewDesc(metricsPrefix+"store_healthy",
		"1 if the shared sticky store answers, 0 while it is known to be down.", []string{"policy"}, nil)
)

func (*stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLatency
	ch <- descActive
	ch <- descObserved
	ch <- descBucket
	ch <- descSticky
	for _, d := range []*prometheus.Desc{descInFlight, descCost, descLoadFactor, descORCAUtil, descORCAAge,
		descORCAReports, descSlowStart} {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{descStoreHits, descStoreMisses, descStoreStale, descStoreErrors,
		descStoreMalformed, descStoreSkipped, descStoreWrites, descStoreRefreshes, descStoreHealthy, descStoreRefusing,
		descStorePending, descStoreReconciled} {
		ch <- d
	}
}

// Collect reads the pooled states, not a config generation's policies: a
// state adopted across a reload is reported once, with its kept values.
func (*stateCollector) Collect(ch chan<- prometheus.Metric) {
	picksByName := allPicks()
	for _, p := range pooledStates() {
		name := p.key.name
		for _, st := range p.Tracker().Statuses() {
			active, bucket := 0.0, float64(st.Bucket)
			if st.Active {
				active = 1
			}
			if !st.Measured {
				bucket = -1
			} else {
				ch <- prometheus.MustNewConstMetric(descLatency, prometheus.GaugeValue, st.Latency.Seconds(), name, st.Addr)
			}
			if st.ObservedSamples > 0 {
				ch <- prometheus.MustNewConstMetric(descObserved, prometheus.GaugeValue, st.Observed.Seconds(), name, st.Addr, "avg")
				ch <- prometheus.MustNewConstMetric(descObserved, prometheus.GaugeValue, st.ObservedPeak.Seconds(), name, st.Addr, "peak")
			}
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active, name, st.Addr)
			ch <- prometheus.MustNewConstMetric(descBucket, prometheus.GaugeValue, bucket, name, st.Addr)
			collectLoad(ch, name, st.Addr, p.Tracker().LoadOf(st.ID, p.Now()))
		}
		if cfg := p.Tracker().Config(); cfg.ORCA {
			absent, by := p.Tracker().LoadReports()
			ch <- prometheus.MustNewConstMetric(descORCAReports, prometheus.CounterValue, float64(absent), name, "absent")
			for r, n := range by {
				ch <- prometheus.MustNewConstMetric(descORCAReports, prometheus.CounterValue, float64(n), name, orca.Reason(r).String())
			}
		}
		if p.Settings().Sticky {
			ch <- prometheus.MustNewConstMetric(descSticky, prometheus.GaugeValue, float64(p.Table().Len()), name)
		}
		if sh := p.StickyStore(); sh != nil {
			_, sticky := picksByName[name].Totals()
			collectStore(ch, name, sh.Health(), p.StickyStoreStats(), sticky)
		}
	}
}

func collectLoad(ch chan<- prometheus.Metric, name, addr string, l pubsel.Load) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{name, addr}, labels...)...)
	}
	gauge(descInFlight, float64(l.InFlight))
	gauge(descCost, l.Cost.Seconds())
	gauge(descLoadFactor, l.Factor)
	gauge(descSlowStart, slowStartProgress(l))
	if l.ORCA.State != orca.StateNone {
		gauge(descORCAUtil, l.ORCA.Utilization, l.ORCA.State.String())
		gauge(descORCAAge, l.ORCA.Age.Seconds())
	}
}

func collectStore(ch chan<- prometheus.Metric, name string, h pubsel.StickyStoreHealth, s *pubsel.StickyStoreStats, stickyPicks uint64) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{name}, labels...)...)
	}
	counter(descStoreHits, localHits(stickyPicks, s), "local")
	counter(descStoreHits, s.StoreHits.Load(), "redis")
	counter(descStoreMisses, s.Misses.Load())
	counter(descStoreStale, s.Stale.Load())
	for reason, n := range s.ErrorsByReason() {
		counter(descStoreErrors, n, reason)
	}
	counter(descStoreReconciled, s.Reconciled.Load(), "kept")
	counter(descStoreReconciled, s.ReconcileAdopted.Load(), "adopted")
	counter(descStoreMalformed, s.Malformed.Load())
	counter(descStoreSkipped, s.Skipped.Load())
	counter(descStoreWrites, s.Writes.Load())
	counter(descStoreRefreshes, s.Refreshes.Load())
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	gauge(descStoreHealthy, b2f(h.Healthy))
	gauge(descStoreRefusing, b2f(h.Refusing))
	gauge(descStorePending, float64(s.Pending()))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
