package latencybucket

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/caddymodules/internal/wrapped"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// fakeInner answers every request with status, or fails it with err; with
// cancel, the client gives up on the request before the answer (its
// context is cancelled, and the transport answers with that).
type fakeInner struct {
	status int
	err    error
	cancel context.CancelFunc
}

func (f fakeInner) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.cancel != nil {
		f.cancel()
		return nil, req.Context().Err()
	}
	if f.err != nil {
		return nil, f.err
	}
	return &http.Response{StatusCode: f.status, Body: http.NoBody, Request: req}, nil
}

// The traffic transport's rule (README, "Latency from real traffic"): an
// error or a 502, 503 or 504 answer counts as a failure, at least the
// policy's traffic_failure_latency; any other answer, 500 included, counts
// as its time to the headers; a request the client gave up on counts for
// nothing. Each case goes to an upstream of its own, read back from the
// tracker's observed figures.
func TestTrafficTransportCountsFailures(t *testing.T) {
	const failureLatency = time.Hour // far above any real round trip here
	tr, err := pubsel.NewTracker(pubsel.Config{Source: pubsel.FromProbe, FailureLatency: failureLatency})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		name   string
		inner  fakeInner
		cancel bool
		want   string // "ok": one sample under failureLatency; "failed": one at it; "none": no sample
	}{
		{"200", fakeInner{status: 200}, false, "ok"},
		{"404", fakeInner{status: 404}, false, "ok"},
		{"500", fakeInner{status: 500}, false, "ok"},
		{"502", fakeInner{status: 502}, false, "failed"},
		{"503", fakeInner{status: 503}, false, "failed"},
		{"504", fakeInner{status: 504}, false, "failed"},
		{"connection refused", fakeInner{err: errors.New("dial tcp: connection refused")}, false, "failed"},
		{"timeout", fakeInner{err: context.DeadlineExceeded}, false, "failed"},
		{"cancelled by the client", fakeInner{}, true, "none"},
	} {
		addr := fmt.Sprintf("127.0.0.1:%d", 9001+i)
		id, err := tr.Ensure(addr)
		if err != nil {
			t.Fatal(err)
		}
		// Two requests: the tracker confirms a sample by the one before it
		// (peakewma), so two answers alike make one sample.
		for range 2 {
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddy.CtxKey("reverse_proxy.dial_info"),
				reverseproxy.DialInfo{Network: "tcp", Address: addr, Host: "127.0.0.1", Port: fmt.Sprint(9001 + i)}))
			inner := c.inner
			if c.cancel {
				inner.cancel = cancel
			}
			rt := &TrafficTransport{Inner: innerOf(inner), target: new(atomic.Pointer[feedTarget])}
			rt.feed(tr, testClock)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://app/", nil)
			resp, err := rt.RoundTrip(req)
			cancel()
			if (err != nil) != (c.inner.err != nil || c.cancel) || (err == nil && resp.StatusCode != c.inner.status) {
				t.Fatalf("%s: the inner transport's answer was not passed on: %v, %v", c.name, resp, err)
			}
		}
		tr.Reevaluate(time.Now())
		st := tr.StatusOf(id)
		got := "none"
		switch {
		case st.ObservedSamples == 1 && st.ObservedPeak >= failureLatency:
			got = "failed"
		case st.ObservedSamples == 1:
			got = "ok"
		case st.ObservedSamples > 1:
			got = fmt.Sprint(st.ObservedSamples, " samples")
		}
		if got != c.want {
			t.Errorf("%s: counted as %s (samples %d, peak %v), want %s", c.name, got, st.ObservedSamples, st.ObservedPeak, c.want)
		}
	}
}

// innerFunc is a RoundTripper of a function.
type innerFunc func(*http.Request) (*http.Response, error)

func (f innerFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A request counts as in flight to its upstream (within p2c's load) while
// the wrapped transport has it, whatever its outcome: an answer, an error,
// a client that gave up.
func TestTrafficTransportCountsInFlight(t *testing.T) {
	tr, err := pubsel.NewTracker(pubsel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "127.0.0.1:9001"
	id, _ := tr.Ensure(addr)
	for _, outcome := range []string{"answer", "error", "cancelled"} {
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddy.CtxKey("reverse_proxy.dial_info"),
			reverseproxy.DialInfo{Network: "tcp", Address: addr, Host: "127.0.0.1", Port: "9001"}))
		var during int64
		rt := &TrafficTransport{target: new(atomic.Pointer[feedTarget]), Inner: innerOf(innerFunc(func(r *http.Request) (*http.Response, error) {
			during = tr.LoadOf(id, 0).InFlight
			switch outcome {
			case "error":
				return nil, errors.New("dial tcp: connection refused")
			case "cancelled":
				cancel()
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		}))}
		rt.feed(tr, testClock)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://app/", nil)
		rt.RoundTrip(req)
		cancel()
		if after := tr.LoadOf(id, 0).InFlight; during != 1 || after != 0 {
			t.Errorf("%s: %d in flight during the round trip, %d after; want 1, 0", outcome, during, after)
		}
	}
}

// testClock is a state clock for transports fed outside a policy.
func testClock() int64 { return time.Now().UnixNano() }

// innerOf is rt as the transport the latency_bucket transport wraps.
func innerOf(rt http.RoundTripper) wrapped.Inner { return wrapped.Wrap(rt, "latency_bucket") }
