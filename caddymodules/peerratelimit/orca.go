package peerratelimit

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/internal/loadsource"
	"github.com/edgesteer/edgesteer/internal/orca"
)

// orcaFeeds keeps each HTTP handler's (or egress transport's) ORCA
// tracker across reloads, under its state's key: the backends' reports and
// their blackout runs are process state, like the throttle level they
// drive, so a reload neither forgets them nor restarts the blackout.
var orcaFeeds = caddy.NewUsagePool()

// maxORCAUpstreams bounds the tracker: its keys are the dial addresses
// reverse_proxy answered from, which dynamic upstreams could multiply.
const maxORCAUpstreams = 1024

// The outcomes of an answer beyond orca.Reason's: counted apart so that a
// backend that never reports is told from one whose reports are refused.
const (
	orcaMissing    = int(orca.NumReasons) + iota // no endpoint-load-metrics header
	orcaNoUpstream                               // not an answer of reverse_proxy
	numORCAOutcomes
)

func orcaOutcome(i int) string {
	switch i {
	case orcaMissing:
		return "missing"
	case orcaNoUpstream:
		return "no_upstream"
	}
	return orca.Reason(i).String()
}

var (
	orcaHeaderKey    = http.CanonicalHeaderKey(orca.Header)
	orcaHeaderBinKey = http.CanonicalHeaderKey(orca.HeaderBin)
)

// orcaFeed reads the load reports in one handler's answers into its
// tracker, and counts every answer by outcome for the metric and the view.
type orcaFeed struct {
	handler  string
	tracker  *orca.Tracker
	counts   [numORCAOutcomes]atomic.Uint64
	counters [numORCAOutcomes]prometheus.Counter
}

// acquireORCAFeed returns the feed kept under key, made if needed, with a
// reload's periods applied.
func acquireORCAFeed(key, handler string, p orca.Periods) (*orcaFeed, error) {
	v, _, err := orcaFeeds.LoadOrNew(key, func() (caddy.Destructor, error) {
		t, err := orca.NewTracker(p, maxORCAUpstreams)
		if err != nil {
			return nil, err
		}
		f := &orcaFeed{handler: handler, tracker: t}
		for i := range f.counters {
			f.counters[i] = theMetrics.orcaAnswers.WithLabelValues(handler, orcaOutcome(i))
		}
		return f, nil
	})
	if err != nil {
		return nil, err
	}
	f := v.(*orcaFeed)
	f.tracker.SetPeriods(p)
	return f, nil
}

// Destruct drops the feed's metric series once no generation holds it.
func (f *orcaFeed) Destruct() error {
	theMetrics.orcaAnswers.DeletePartialMatch(prometheus.Labels{"handler": f.handler})
	return nil
}

// observe reads one answer's headers from upstream (its dial address; ""
// when no reverse_proxy answered) at now. A missing, repeated or refused
// header changes nothing; every answer is counted by its outcome.
func (f *orcaFeed) observe(h http.Header, upstream string, now int64) {
	out := f.read(h, upstream, now)
	f.counts[out].Add(1)
	f.counters[out].Inc()
}

func (f *orcaFeed) read(h http.Header, upstream string, now int64) int {
	if upstream == "" {
		return orcaNoUpstream
	}
	vals, parse := h[orcaHeaderKey], orca.Parse
	if len(vals) == 0 {
		vals, parse = h[orcaHeaderBinKey], orca.ParseBin
	}
	switch len(vals) {
	case 0:
		return orcaMissing
	case 1:
	default:
		return int(orca.ReasonDuplicate) // two reports in one answer: neither is believed
	}
	var r orca.Report
	if why := parse(vals[0], &r); why != orca.ReasonOK {
		return int(why)
	}
	return int(f.tracker.ObserveCPU(upstream, &r, now))
}

// orcaWriter hands the answer's headers to the feed when they are
// written: reverse_proxy has copied the upstream's headers into them and
// set {http.reverse_proxy.upstream.hostport} by then.
type orcaWriter struct {
	*caddyhttp.ResponseWriterWrapper
	feed *orcaFeed
	repl *caddy.Replacer
	seen bool
}

func (w *orcaWriter) see() {
	if !w.seen {
		w.seen = true
		upstream, _ := w.repl.GetString("http.reverse_proxy.upstream.hostport")
		w.feed.observe(w.Header(), upstream, time.Now().UnixNano())
	}
}

// WriteHeader reads the final answer's headers, not an informational
// (1xx) one's.
func (w *orcaWriter) WriteHeader(code int) {
	if code >= 200 {
		w.see()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *orcaWriter) Write(b []byte) (int, error) {
	w.see()
	return w.ResponseWriter.Write(b)
}

func (w *orcaWriter) ReadFrom(r io.Reader) (int64, error) {
	w.see()
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// serveORCA passes the request on with the answer's headers going to f.
func serveORCA(f *orcaFeed, w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler) error {
	return next.ServeHTTP(&orcaWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, feed: f, repl: repl}, r)
}

// orcaPeriods returns A58's periods with the configured overrides, naming
// a bad option and value after prefix.
func (c *DynamicConfig) orcaPeriods(prefix string) (orca.Periods, error) {
	p := orca.DefaultPeriods
	if c.ORCABlackout != nil {
		p.Blackout = time.Duration(*c.ORCABlackout)
		if p.Blackout < 0 {
			return p, fmt.Errorf("%sdynamic orca_blackout %v: must not be negative", prefix, p.Blackout)
		}
	}
	if c.ORCAExpiration != 0 {
		p.Expiration = time.Duration(c.ORCAExpiration)
		if p.Expiration < 0 {
			return p, fmt.Errorf("%sdynamic orca_expiration %v: must be positive", prefix, p.Expiration)
		}
	}
	return p, nil
}

// orcaSource checks the orca options and returns the source over f's
// tracker; f is nil where no answer header passes (layer 4).
func (c *DynamicConfig) orcaSource(prefix string, f *orcaFeed) (loadsource.Source, error) {
	if c.Source != "orca" {
		var blackout time.Duration
		if c.ORCABlackout != nil {
			blackout = time.Duration(*c.ORCABlackout)
		}
		for _, o := range []struct {
			opt string
			set bool
			v   any
		}{{"aggregate", c.Aggregate != "", strconv.Quote(c.Aggregate)}, {"orca_blackout", c.ORCABlackout != nil, blackout},
			{"orca_expiration", c.ORCAExpiration != 0, time.Duration(c.ORCAExpiration)}} {
			if o.set {
				return nil, fmt.Errorf("%sdynamic %s %v: applies to source orca only", prefix, o.opt, o.v)
			}
		}
		return nil, nil
	}
	agg, err := orca.ParseAggregate(c.Aggregate)
	if err != nil {
		return nil, fmt.Errorf("%sdynamic source orca %q: want max or mean", prefix, c.Aggregate)
	}
	if _, err := c.orcaPeriods(prefix); err != nil {
		return nil, err
	}
	if f == nil {
		return nil, fmt.Errorf("%sdynamic source orca: reads the %s header of HTTP answers, and layer 4 has none: use it in an HTTP peer_rate_limit handler or egress transport, or use prometheus, procstat or file", prefix, orca.Header)
	}
	return &orca.Source{Tracker: f.tracker, Aggregate: agg, Clock: func() int64 { return time.Now().UnixNano() }}, nil
}

// ORCAView is the orca source's state in the admin API.
type ORCAView struct {
	Aggregate    string `json:"aggregate"` // max or mean
	BlackoutMs   int64  `json:"blackout_ms"`
	ExpirationMs int64  `json:"expiration_ms"`
	// Answers counts the answers read since the state was made, by
	// outcome: ok, missing, no_upstream, or why a header was refused.
	Answers   map[string]uint64  `json:"answers"`
	Upstreams []ORCAUpstreamView `json:"upstreams"`
}

// ORCAUpstreamView is one upstream's latest report.
type ORCAUpstreamView struct {
	Upstream       string  `json:"upstream"`
	CPUUtilization float64 `json:"cpu_utilization"`
	// State: blackout (reporting for less than orca_blackout), fresh
	// (counted in the load) or expired (no report for orca_expiration).
	State               string  `json:"state"`
	AgeSeconds          float64 `json:"age_seconds"`
	ReportingForSeconds float64 `json:"reporting_for_seconds"`
}

func (f *orcaFeed) view(src loadsource.Source) *ORCAView {
	p := f.tracker.Periods()
	v := &ORCAView{BlackoutMs: p.Blackout.Milliseconds(), ExpirationMs: p.Expiration.Milliseconds(),
		Answers: map[string]uint64{}, Upstreams: []ORCAUpstreamView{}}
	if s, ok := src.(*orca.Source); ok {
		v.Aggregate = s.Aggregate.String()
	}
	for i := range f.counts {
		if n := f.counts[i].Load(); n > 0 {
			v.Answers[orcaOutcome(i)] = n
		}
	}
	now := time.Now().UnixNano()
	f.tracker.Each(func(key string, u *orca.Upstream) {
		s := u.Snapshot(now, p)
		v.Upstreams = append(v.Upstreams, ORCAUpstreamView{Upstream: key, CPUUtilization: s.CPUUtilization,
			State: s.State.String(), AgeSeconds: s.Age.Seconds(), ReportingForSeconds: s.ReportingFor.Seconds()})
	})
	slices.SortFunc(v.Upstreams, func(a, b ORCAUpstreamView) int { return strings.Compare(a.Upstream, b.Upstream) })
	return v
}
