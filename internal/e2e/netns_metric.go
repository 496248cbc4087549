package e2e

import (
	"io"
	"testing"
)

// MetricAt scrapes the Prometheus exposition at url (http://addr/metrics)
// from inside host's namespace and returns series' value (a name, or a
// name with some of its labels, as Caddy.Metric takes); ok is false when
// no line matches. Topology.Metric is the same for a Caddy's admin API.
func (tp *Topology) MetricAt(t testing.TB, host, url, series string) (value float64, ok bool) {
	t.Helper()
	resp, err := tp.HTTPClient(host).Get(url)
	if err != nil {
		t.Fatalf("GET %s in %s: %v", url, host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return metricValue(string(body), series)
}
