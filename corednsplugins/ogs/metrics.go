package ogs

import (
	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	probes = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "probes_total",
		Help: "Gateway probes by gateway and result (ok or failed).",
	}, []string{"gateway", "result"})
	probeRTT = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "probe_rtt_seconds",
		Help:    "Round-trip time of successful gateway probes.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms … 8 s
	}, []string{"gateway"})
	runs = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "probe_runs_total",
		Help: "Probe runs (one per location whose entry was missing or expired).",
	})
	cacheHits = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "cache_hits_total",
		Help: "Queries answered from a location's cached selection.",
	}, []string{"server"})
	cacheMisses = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "cache_misses_total",
		Help: "Queries whose location had no fresh selection.",
	}, []string{"server"})
	fallbacks = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "fallbacks_total",
		Help: "Queries answered without a fresh selection, by what answered (previous or configured) and why (deadline, no_answer, retry_wait, closed).",
	}, []string{"server", "kind", "why"})
	probeFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "probe_failures_total",
		Help: "Failed gateway probes (runs and re-checks) by gateway and reason.",
	}, []string{"gateway", "reason"})
	rechecks = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "rechecks_total",
		Help: "Background re-check probes of cached first choices, by gateway and result (ok or failed).",
	}, []string{"gateway", "result"})
)

// The shared cache level (store redis).
var (
	storeHits = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "store_hits_total",
		Help: "Queries answered from a fresh cached selection, by cache level (local: this process's memory; redis: the shared store).",
	}, []string{"level"})
	storeErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "store_errors_total",
		Help: "Shared store calls that failed (the replica probed locally), by operation, keys (value, lock, value+lock, any) and reason.",
	}, []string{"operation", "keys", "reason"})
	storeAdopted = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "store_adopted_total",
		Help: "Probe runs whose result was not written because another replica's was stored first (this replica answers the stored one).",
	})
	storeMalformed = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "store_malformed_total",
		Help: "Shared store values that did not parse or validate (ignored).",
	})
	storeStale = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "store_stale_total",
		Help: "Shared store values measured with another probe or other gateways (ignored).",
	})
	lockWaits = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "cluster_lock_waits_total",
		Help: "Probe runs not started because another replica held the location's probe lock (this one waited for its result).",
	})
)

// Client reports (reports.go).
var (
	reportsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "reports_total",
		Help: "Reports received on POST /ogs/reports, by result: accepted, or the reason refused (unauthorized, too_large, rate_limited_token, rate_limited_source, malformed, unknown_gateway, rtt_out_of_range, future, stale, ...).",
	}, []string{"result"})
	reportLocations = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "report_locations",
		Help: "Locations holding client reports, by state name (after the latest accepted report).",
	}, []string{"state"})
	reportAnswers = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace, Subsystem: pluginName, Name: "report_answers_total",
		Help: "Queries answered from their location's client reports.",
	}, []string{"server"})
)
