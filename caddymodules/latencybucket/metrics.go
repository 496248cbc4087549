package latencybucket

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/internal/latency"
)

const metricsPrefix = "caddy_edgesteer_latency_bucket_"

type metrics struct {
	selections    *prometheus.CounterVec
	probeRTT      *prometheus.HistogramVec
	probeFailures *prometheus.CounterVec
	state         stateCollector
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
			selections: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: metricsPrefix + "selections_total",
				Help: "Publisher selections by policy, publisher, latency bucket and decision (new pick or sticky).",
			}, []string{"policy", "publisher", "bucket", "decision"}),
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
	err := metricsreg.Register(ctx, theMetrics.selections, theMetrics.probeRTT, theMetrics.probeFailures, &theMetrics.state)
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

// stateCollector reports every live policy state's publishers at scrape
// time. It is registered with each config generation's registry (Caddy
// makes one per load) and reads the process-level pool, so the gauges show
// the adopted state after a reload.
type stateCollector struct{}

var (
	descLatency = prometheus.NewDesc(metricsPrefix+"publisher_latency_seconds",
		"Publisher latency: probe minimum over the window plus the static segment.", []string{"policy", "publisher"}, nil)
	descActive = prometheus.NewDesc(metricsPrefix+"publisher_active",
		"1 if the publisher's last probe round had a success.", []string{"policy", "publisher"}, nil)
	descBucket = prometheus.NewDesc(metricsPrefix+"publisher_bucket",
		"Index of the publisher's latency bucket (0 is [0,w)); -1 unmeasured.", []string{"policy", "publisher"}, nil)
	descSticky = prometheus.NewDesc(metricsPrefix+"sticky_entries",
		"Entries in the policy's sticky table.", []string{"policy"}, nil)
)

func (*stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLatency
	ch <- descActive
	ch <- descBucket
	ch <- descSticky
}

// Collect reads the pooled states, not a config generation's policies: a
// state adopted across a reload is reported once, with its kept values.
func (*stateCollector) Collect(ch chan<- prometheus.Metric) {
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
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active, name, st.Addr)
			ch <- prometheus.MustNewConstMetric(descBucket, prometheus.GaugeValue, bucket, name, st.Addr)
		}
		if p.Settings().Sticky {
			ch <- prometheus.MustNewConstMetric(descSticky, prometheus.GaugeValue, float64(p.Table().Len()), name)
		}
	}
}
