package peerratelimit

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

const metricsPrefix = "caddy_edgesteer_peer_rate_limit_"

type metrics struct {
	throttle     *prometheus.GaugeVec
	load         *prometheus.GaugeVec
	sourceErrors *prometheus.CounterVec
	orcaAnswers  *prometheus.CounterVec

	refusalsDiscarded *prometheus.CounterVec
	originMismatch    *prometheus.CounterVec

	clusterSyncs     *prometheus.CounterVec
	clusterErrors    *prometheus.CounterVec
	clusterMalformed *prometheus.CounterVec
	clusterFallback  *prometheus.GaugeVec
	clusterReplicas  *prometheus.GaugeVec

	clusterFallbackPeers *prometheus.GaugeVec
	clusterClockOffset   *prometheus.GaugeVec
}

var theMetrics = &metrics{
	throttle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "dynamic_throttle_percent",
		Help: "Percent of the static rate withheld by dynamic throttling.",
	}, []string{"handler"}),
	load: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "dynamic_load_percent",
		Help: "Last load read from the dynamic load source.",
	}, []string{"handler"}),
	sourceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "dynamic_load_source_errors_total",
		Help: "Failed reads of the dynamic load source (the throttle level is kept).",
	}, []string{"handler"}),
	orcaAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "orca_answers_total",
		Help: "Answers read by the orca load source, by outcome: ok (the report counts), missing (no endpoint-load-metrics header), no_upstream (not an answer of reverse_proxy), no_utilization (no cpu_utilization), table_full, or why the header was refused (empty, too_long, unknown_format, syntax, unknown_field, duplicate, bad_number, non_finite, out_of_range, bad_name, too_many_metrics, bad_base64, bad_proto).",
	}, []string{"handler", "outcome"}),
	refusalsDiscarded: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "diameter_refusals_discarded_total",
		Help: "Diameter refusals never written: the queue waiting for the upstream's message boundary was full (queue_full), or the upstream stalled inside a message and the connection was closed (upstream_stalled).",
	}, []string{"handler", "reason"}),
	originMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "diameter_origin_host_mismatch_total",
		Help: "Diameter requests whose Origin-Host differs from the one their connection's CER negotiated (they are limited as the CER's peer).",
	}, []string{"handler"}),
	clusterSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "cluster_sync_total",
		Help: "Successful syncs of a cluster-wide limit with its Redis store.",
	}, []string{"handler", "profile"}),
	clusterErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "cluster_errors_total",
		Help: "Store trouble of a cluster-wide limit by reason (noperm, noauth, loading, readonly, oom, clusterdown, tryagain, moved, busy, timeout, closed, refused, reset, network, error_reply, other): one per failed sync (every share the fallback) and one per key a sync could not read or write (its peer's share the fallback).",
	}, []string{"handler", "profile", "reason"}),
	clusterMalformed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricsPrefix + "cluster_malformed_total",
		Help: "Redis answers of a cluster-wide limit that did not parse (another program's key or value under the prefix): ignored.",
	}, []string{"handler", "profile"}),
	clusterFallback: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "cluster_fallback",
		Help: "1 while the last sync failed and the replica enforces limit ÷ last known replicas, else 0.",
	}, []string{"handler", "profile"}),
	clusterFallbackPeers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "cluster_fallback_peers",
		Help: "Peers (of all a profile's cluster-wide limits) whose share is limit ÷ last known replicas because the last sync could not read or write their keys, or failed.",
	}, []string{"handler", "profile"}),
	clusterReplicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "cluster_replicas",
		Help: "Live replicas seen at the last successful sync of a cluster-wide limit.",
	}, []string{"handler", "profile"}),
	clusterClockOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricsPrefix + "cluster_clock_offset_seconds",
		Help: "This replica's clock minus the cluster store's (Redis TIME), as measured at the last syncs; epochs and heartbeats follow the store's clock.",
	}, []string{"handler", "profile"}),
}

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, decisionsCollector{}, theMetrics.throttle, theMetrics.load, theMetrics.sourceErrors, theMetrics.orcaAnswers, theMetrics.refusalsDiscarded, theMetrics.originMismatch,
		theMetrics.clusterSyncs, theMetrics.clusterErrors, theMetrics.clusterMalformed, theMetrics.clusterFallback, theMetrics.clusterReplicas, theMetrics.clusterFallbackPeers, theMetrics.clusterClockOffset)
}

// decisionsDesc is the decisions metric. Its values are the engines'
// tallies (ratelimit.Store.Tallies): a series lives as long as its
// handler's state, across reloads.
var decisionsDesc = prometheus.NewDesc(metricsPrefix+"decisions_total",
	"Rate-limit decisions by handler, profile, message type, and verdict (admitted, rejected, dropped).",
	[]string{"handler", "profile", "message_type", "verdict"}, nil)

// decisionsCollector exports decisionCounts.
type decisionsCollector struct{}

func (decisionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- decisionsDesc }

func (decisionsCollector) Collect(ch chan<- prometheus.Metric) {
	for k, counts := range decisionCounts() {
		for v, n := range counts {
			ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(n),
				k.handler, k.profile, k.msgType, ratelimit.Verdicts[v])
		}
	}
}

// decisionKey is a decisions series but for its verdict.
type decisionKey struct{ handler, profile, msgType string }

// decisionCounts are the live handler states' tallies by handler name,
// profile and message type. Handlers of two kinds may have one name: the
// metric has no kind label, so their tallies add up in one series.
func decisionCounts() map[decisionKey][3]uint64 {
	out := map[decisionKey][3]uint64{}
	for _, hs := range registry.List(func(hs *handlerState) string { return hs.name }) {
		for _, t := range hs.store.Tallies() {
			k := decisionKey{hs.name, t.Profile, t.Type}
			sum, n := out[k], t.Counts()
			for v := range sum {
				sum[v] += n[v]
			}
			out[k] = sum
		}
	}
	return out
}
