package latencybucket

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/internal/wrapped"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

func init() {
	caddy.RegisterModule(TrafficTransport{})
}

// TrafficTransport times every proxied request to its response headers
// and feeds the latency_bucket policy of the same reverse_proxy (its
// observed latency, for `latency traffic` and `both`). It wraps the
// transport that does the work (default http), as peer_rate_limit's
// egress transport does; either may wrap the other.
type TrafficTransport struct {
	// TransportRaw is the wrapped transport; default "http".
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`

	wrapped.Inner
	handler *reverseproxy.Handler
	target  *atomic.Pointer[feedTarget] // set by the policy; made at Provision
}

// feedTarget is what the transport reports to: the policy state's tracker
// and its clock (ORCA reports are timed on it, as picks read them).
type feedTarget struct {
	tr  *pubsel.Tracker
	now func() int64
}

// transports maps a reverse_proxy handler to its latency_bucket
// transport, so that the handler's policy (provisioned after the
// transport) finds it. Entries live from the transport's Provision to its
// Cleanup: one per loaded handler.
var transports sync.Map // *reverseproxy.Handler → *TrafficTransport

// CaddyModule returns the Caddy module information.
func (TrafficTransport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.latency_bucket",
		New: func() caddy.Module { return new(TrafficTransport) },
	}
}

// Provision loads the wrapped transport and registers with the enclosing
// reverse_proxy.
func (t *TrafficTransport) Provision(ctx caddy.Context) error {
	if err := t.Load(ctx, t, &t.TransportRaw, "latency_bucket", "latency_bucket: transport"); err != nil {
		return err
	}
	t.target = new(atomic.Pointer[feedTarget])
	for _, m := range ctx.Modules() {
		if h, ok := m.(*reverseproxy.Handler); ok {
			t.handler = h
		}
	}
	if t.handler == nil {
		return fmt.Errorf("latency_bucket: transport: not inside a reverse_proxy")
	}
	transports.Store(t.handler, t)
	return nil
}

// transportOf returns the latency_bucket transport of handler h, or nil.
func transportOf(h *reverseproxy.Handler) *TrafficTransport {
	if v, ok := transports.Load(h); ok {
		return v.(*TrafficTransport)
	}
	return nil
}

// Cleanup unregisters and cleans up the wrapped transport.
func (t *TrafficTransport) Cleanup() error {
	if t.handler != nil {
		transports.CompareAndDelete(t.handler, t)
	}
	return t.CleanupInner()
}

// feed makes the transport report to tr, ORCA reports on the clock now
// (the state's, which picks read them on).
func (t *TrafficTransport) feed(tr *pubsel.Tracker, now func() int64) {
	t.target.Store(&feedTarget{tr, now})
}

// RoundTrip forwards req with the wrapped transport and records the time
// to its response headers against the upstream it was sent to. An error,
// or a 502, 503 or 504 answer, counts as a failure (at least the policy's
// traffic_failure_latency); a request the client gave up on counts for
// nothing. The request counts as in flight to its upstream (for within
// p2c) from the moment it is sent until its response headers or error
// arrive. Its own cost is two monotonic clock reads, one context lookup
// (reverse_proxy set the dial info before calling us), one map lookup in
// the tracker's copy-on-write index and four atomic adds: no lock, no
// allocation. With ORCA on (within p2c), the answer's
// endpoint-load-metrics header (else endpoint-load-metrics-bin) is read
// into the upstream's load report; see reportLoad.
func (t *TrafficTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ft := t.target.Load()
	if ft == nil {
		return t.Forward(req)
	}
	tr := ft.tr
	di, ok := reverseproxy.GetDialInfo(req.Context())
	if !ok {
		return t.Forward(req)
	}
	f := tr.Begin(di.Address)
	start := mono()
	resp, err := t.Forward(req)
	took := mono() - start
	f.Done()
	if err != nil && req.Context().Err() != nil {
		return resp, err
	}
	failed := err != nil
	if resp != nil {
		switch resp.StatusCode {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			failed = true
		}
	}
	tr.ObserveFlight(f, took, failed)
	if resp != nil && tr.ORCA() {
		reportLoad(tr, f, resp.Header, ft.now)
	}
	return resp, err
}

// The ORCA headers as Go's textproto keys them: a direct map read skips
// Header.Get's canonicalization.
const (
	orcaKey    = "Endpoint-Load-Metrics"
	orcaBinKey = "Endpoint-Load-Metrics-Bin"
)

// reportLoad hands the answer's ORCA header to the tracker, which parses
// it (bounded, allocation-free for TEXT and JSON) and counts its outcome:
// absent, taken, or refused with its reason. Only the first value is
// read. Failures report too: a backend that says why it is overloaded
// in a 503 is worth hearing.
func reportLoad(tr *pubsel.Tracker, f pubsel.Flight, h http.Header, now func() int64) {
	if v := h[orcaKey]; len(v) > 0 {
		tr.ReportLoad(f, v[0], false, now())
	} else if v := h[orcaBinKey]; len(v) > 0 {
		tr.ReportLoad(f, v[0], true, now())
	} else {
		tr.ReportLoad(f, "", false, 0)
	}
}

// monoEpoch anchors mono. time.Since of a time that carries a monotonic
// reading reads the monotonic clock alone, where time.Now also reads the
// wall clock: two clock reads per request instead of four.
var monoEpoch = time.Now()

// mono is the monotonic time since the process started.
func mono() time.Duration { return time.Since(monoEpoch) }

// UnmarshalCaddyfile reads
//
//	transport latency_bucket {
//		transport <name> { … }     # the wrapped transport, default http
//	}
func (t *TrafficTransport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "latency_bucket: transport", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		switch o.Name() {
		case "transport":
			if t.TransportRaw, err = wrapped.Unmarshal(o); err != nil {
				return err
			}
		default:
			return o.Unknown()
		}
	}
	return nil
}

// Interface guards
var (
	_ http.RoundTripper                   = (*TrafficTransport)(nil)
	_ caddy.Provisioner                   = (*TrafficTransport)(nil)
	_ caddy.CleanerUpper                  = (*TrafficTransport)(nil)
	_ caddyfile.Unmarshaler               = (*TrafficTransport)(nil)
	_ reverseproxy.TLSTransport           = (*TrafficTransport)(nil)
	_ reverseproxy.ProxyProtocolTransport = (*TrafficTransport)(nil)
)

// Interface guards: the wrapped transport's abilities pass through.
var (
	_ reverseproxy.TLSTransport           = (*TrafficTransport)(nil)
	_ reverseproxy.ProxyProtocolTransport = (*TrafficTransport)(nil)
	_ caddy.CleanerUpper                  = (*TrafficTransport)(nil)
)
