package loadsource

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxBodySize keeps a huge or endless exposition (e.g. a node exporter with
// thousands of series) from exhausting memory.
const maxBodySize = 4 << 20

// defaultClient has a timeout so that a hung exporter cannot stall the
// limiter's refresh loop when the caller's context has no deadline, and
// follows no redirect: the configured URL is the only one fetched (a 3xx
// is an error naming its Location).
var defaultClient = &http.Client{Timeout: 5 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// Prometheus reads one sample of a metric from a Prometheus text-format
// endpoint, so any existing exporter can feed the limiter.
type Prometheus struct {
	URL    string            // http(s) URL of the endpoint
	Metric string            // metric family name
	Labels map[string]string // every one must match the sample's labels; extra labels on the sample are fine
	Client *http.Client      // nil: a client with a 5 s timeout
}

// NewPrometheus validates the configuration up front, so that typos show up
// at startup rather than as read errors at run time.
func NewPrometheus(rawURL, metric string, labels map[string]string) (*Prometheus, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("url %q: %w", rawURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("url %q: scheme must be http or https", rawURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("url %q: missing host", rawURL)
	}
	// Legacy names only: those are the ones that can be written unquoted in
	// configuration and in the text format.
	if !model.LegacyValidation.IsValidMetricName(metric) {
		return nil, fmt.Errorf("metric %q: not a valid metric name", metric)
	}
	ls := make(map[string]string, len(labels))
	for k, v := range labels {
		if !model.LegacyValidation.IsValidLabelName(k) {
			return nil, fmt.Errorf("labels: %q is not a valid label name", k)
		}
		ls[k] = v
	}
	return &Prometheus{URL: rawURL, Metric: metric, Labels: ls}, nil
}

// String names the source for views and logs, with any password in the
// URL replaced by "xxxxx".
func (p *Prometheus) String() string {
	shown := p.URL
	if u, err := url.Parse(p.URL); err == nil {
		shown = u.Redacted()
	}
	return "prometheus " + shown + " " + p.Metric + formatLabels(p.Labels)
}

// formatLabels renders labels in sorted order so that log lines are stable.
func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return ""
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, labels[k])
	}
	b.WriteByte('}')
	return b.String()
}

// Read fetches and parses the whole exposition each time; exporters offer no
// way to ask for a single series.
func (p *Prometheus) Read(ctx context.Context) (float64, error) {
	v, err := p.read(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return v, nil
}

func (p *Prometheus) read(ctx context.Context) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return 0, err
	}
	// Ask for the text format: it is the only one parsed here.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	client := p.Client
	if client == nil {
		client = defaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return 0, fmt.Errorf("status %s → %.200s (redirects are not followed)", resp.Status, resp.Header.Get("Location"))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodySize+1))
	if err != nil {
		return 0, fmt.Errorf("reading body: %w", err)
	}
	if len(body) > maxBodySize {
		// A truncated body could silently lose the sample we need.
		return 0, fmt.Errorf("body larger than %d bytes", maxBodySize)
	}
	// UTF-8 validation, because the zero TextParser is invalid and because
	// other families in the same exposition may use quoted UTF-8 names.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("parsing body: %w", err)
	}
	mf, ok := families[p.Metric]
	if !ok {
		return 0, fmt.Errorf("metric %s not found", p.Metric)
	}
	for _, m := range mf.GetMetric() {
		if !labelsMatch(m, p.Labels) {
			continue
		}
		var v float64
		switch mf.GetType() {
		case dto.MetricType_GAUGE:
			v = m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			v = m.GetCounter().GetValue()
		case dto.MetricType_UNTYPED:
			v = m.GetUntyped().GetValue()
		default:
			return 0, fmt.Errorf("metric %s has type %s, want gauge, counter or untyped",
				p.Metric, strings.ToLower(mf.GetType().String()))
		}
		if err := checkRange(v); err != nil {
			return 0, err
		}
		return v, nil
	}
	return 0, fmt.Errorf("no sample of %s matches labels %s", p.Metric, formatLabels(p.Labels))
}

// labelsMatch follows PromQL, where a missing label equals the empty string.
func labelsMatch(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		got := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k {
				got = lp.GetValue()
				break
			}
		}
		if got != v {
			return false
		}
	}
	return true
}
