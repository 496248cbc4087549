package diameteragent

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

const metricsPrefix = "caddy_edgesteer_diameter_agent_"

// collector reads every live agent's view at scrape time: the engine
// keeps the counts (across reloads), so nothing is counted twice.
type collector struct{}

var (
	descPeerUp = prometheus.NewDesc(metricsPrefix+"peer_up",
		"1 while the upstream peer's watchdog is OKAY (only OKAY peers are routed to), else 0.", []string{"agent", "peer", "state"}, nil)
	descPeerOutstanding = prometheus.NewDesc(metricsPrefix+"peer_outstanding",
		"Requests forwarded to the upstream peer and awaiting its answer.", []string{"agent", "peer"}, nil)
	descPeerLatency = prometheus.NewDesc(metricsPrefix+"peer_answer_latency_seconds",
		"Moving average of the upstream peer's answer latency.", []string{"agent", "peer"}, nil)
	descGroupRequests = prometheus.NewDesc(metricsPrefix+"group_requests_total",
		"Requests routed to a peer group by outcome: admitted (forwarded), refused (egress limit), busy (3004), unavailable (no server OKAY, 3002), failed_over (re-sent with the T flag), timed_out (answered 3002 at request_timeout).",
		[]string{"agent", "group", "outcome"}, nil)
	descGroupPending = prometheus.NewDesc(metricsPrefix+"group_pending",
		"Requests of the group awaiting an answer.", []string{"agent", "group"}, nil)
	descGroupThrottle = prometheus.NewDesc(metricsPrefix+"group_throttle_percent",
		"Percent of the group's egress rates withheld by dynamic throttling (groups with a dynamic block).", []string{"agent", "group"}, nil)
	descGroupLoad = prometheus.NewDesc(metricsPrefix+"group_load_percent",
		"The last load read for the group's dynamic throttling.", []string{"agent", "group"}, nil)
	descBindings = prometheus.NewDesc(metricsPrefix+"bindings",
		"Session-Id bindings held.", []string{"agent"}, nil)
	descDownstreams = prometheus.NewDesc(metricsPrefix+"downstream_peers",
		"Downstream (client) peers connected.", []string{"agent"}, nil)
	descEvents = prometheus.NewDesc(metricsPrefix+"events_total",
		"The agent's own counts by event: late_answer (discarded), undelivered, timed_out, loop (3005), realm_not_served (3003), unable_to_deliver (3002), too_busy (3004), ingress_refused, binding_ended, downstream_dwr, downstream_dpr.",
		[]string{"agent", "event"}, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPeerUp, descPeerOutstanding, descPeerLatency, descGroupRequests,
		descGroupPending, descGroupThrottle, descGroupLoad, descBindings, descDownstreams, descEvents} {
		ch <- d
	}
	for _, d := range doicDescs {
		ch <- d
	}
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range liveAgents() {
		collectView(ch, e.name, e.agent.View())
	}
}

func collectView(ch chan<- prometheus.Metric, name string, v diameteragent.View) {
	gauge := func(d *prometheus.Desc, val float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, val, labels...)
	}
	counter := func(d *prometheus.Desc, val int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(val), labels...)
	}
	for _, p := range v.Peers {
		up := 0.0
		if p.State == "OKAY" {
			up = 1
		}
		gauge(descPeerUp, up, name, p.Host, p.State)
		gauge(descPeerOutstanding, float64(p.Outstanding), name, p.Host)
		gauge(descPeerLatency, p.Latency.Seconds(), name, p.Host)
	}
	for _, g := range v.Groups {
		for _, o := range []struct {
			outcome string
			n       int64
		}{{"admitted", g.Admitted}, {"refused", g.Refused}, {"busy", g.Busy}, {"unavailable", g.Unavailable},
			{"failed_over", g.FailedOver}, {"timed_out", g.TimedOut}} {
			counter(descGroupRequests, o.n, name, g.Name, o.outcome)
		}
		gauge(descGroupPending, float64(g.Pending), name, g.Name)
		if d := g.Dynamic; d != nil {
			gauge(descGroupThrottle, float64(d.ThrottlePercent), name, g.Name)
			gauge(descGroupLoad, d.LoadPercent, name, g.Name)
		}
	}
	gauge(descBindings, float64(v.Bindings), name)
	gauge(descDownstreams, float64(len(v.Downstreams)), name)
	c := v.Counts
	for _, o := range []struct {
		event string
		n     int64
	}{{"late_answer", c.Late}, {"undelivered", c.Undelivered}, {"timed_out", c.TimedOut}, {"loop", c.Loops},
		{"realm_not_served", c.RealmNotServed}, {"unable_to_deliver", c.UnableToDeliver}, {"too_busy", c.TooBusy},
		{"ingress_refused", c.IngressRefused}, {"binding_ended", c.BindingsEnded}, {"downstream_dwr", c.DownstreamDWR},
		{"downstream_dpr", c.DownstreamDPR}} {
		counter(descEvents, o.n, name, o.event)
	}
	collectDOIC(ch, name, v)
}

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, theCollector)
}

var theCollector prometheus.Collector = collector{}
