package diameteragent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

// DOIC and load metrics (agents with a doic block).
var (
	descDOICReceived = prometheus.NewDesc(metricsPrefix+"doic_reports_received_total",
		"Valid OC-OLRs read in servers' answers.", []string{"agent"}, nil)
	descDOICIgnored = prometheus.NewDesc(metricsPrefix+"doic_ignored_total",
		"OC-OLR and Load AVPs ignored, by reason.", []string{"agent", "reason"}, nil)
	descDOICThrottled = prometheus.NewDesc(metricsPrefix+"doic_throttled_total",
		"Requests refused because a report in force throttled them.", []string{"agent"}, nil)
	descDOICSent = prometheus.NewDesc(metricsPrefix+"doic_reports_sent_total",
		"Answers that carried the agent's own OC-OLR.", []string{"agent"}, nil)
	descDOICReduction = prometheus.NewDesc(metricsPrefix+"doic_reduction_percent",
		"Reductions in force (servers' reports), by report type and the host, realm or peer reported.", []string{"agent", "type", "name"}, nil)
	descDOICExpiry = prometheus.NewDesc(metricsPrefix+"doic_report_expiry_seconds",
		"When each report in force expires (Unix time).", []string{"agent", "type", "name"}, nil)
	descGroupReported = prometheus.NewDesc(metricsPrefix+"group_doic_reported_percent",
		"The reduction the agent reports for the group in its answers to DOIC clients.", []string{"agent", "group"}, nil)
	descPeerLoad = prometheus.NewDesc(metricsPrefix+"peer_load",
		"The server's last RFC 8583 Load-Value (0-65535).", []string{"agent", "peer"}, nil)
)

var doicDescs = []*prometheus.Desc{descDOICReceived, descDOICIgnored, descDOICThrottled, descDOICSent,
	descDOICReduction, descDOICExpiry, descGroupReported, descPeerLoad}

func collectDOIC(ch chan<- prometheus.Metric, name string, v diameteragent.View) {
	o := v.DOIC
	if o == nil {
		return
	}
	m := func(d *prometheus.Desc, t prometheus.ValueType, val float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, val, labels...)
	}
	m(descDOICReceived, prometheus.CounterValue, float64(o.ReportsReceived), name)
	m(descDOICThrottled, prometheus.CounterValue, float64(o.Throttled), name)
	m(descDOICSent, prometheus.CounterValue, float64(o.ReportsSent), name)
	for r, n := range o.Ignored {
		m(descDOICIgnored, prometheus.CounterValue, float64(n), name, r)
	}
	for _, r := range o.Reports {
		m(descDOICReduction, prometheus.GaugeValue, float64(r.Reduction), name, r.Type, r.Name)
		m(descDOICExpiry, prometheus.GaugeValue, float64(r.Expires.Unix()), name, r.Type, r.Name)
	}
	for _, g := range v.Groups {
		if g.Report != nil {
			m(descGroupReported, prometheus.GaugeValue, float64(g.Report.Reduction), name, g.Name)
		}
	}
	for _, p := range v.Peers {
		if p.Load != nil {
			m(descPeerLoad, prometheus.GaugeValue, float64(*p.Load), name, p.Host)
		}
	}
}
