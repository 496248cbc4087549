package gatewaysel

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// Real probes against real listeners give the reason a person would name.
func TestReasonOfRealProbeFailures(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer plain.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }))
	defer failing.Close()
	selfSigned := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer selfSigned.Close()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	silent, _ := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	defer silent.Close()
	hangup, _ := net.Listen("tcp", "127.0.0.1:0") // accepts, closes at once
	defer hangup.Close()
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := func(u string) string { return strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://") }
	httpsProbe := latency.NewHTTPProber("https", "/", "", &tls.Config{InsecureSkipVerify: true}, true)
	httpProbe := latency.NewHTTPProber("http", "/", "", nil, true)
	for _, tc := range []struct {
		name   string
		prober latency.Prober
		addr   string
		want   string
	}{
		{"nothing listens", latency.TCPProber{}, closedAddr, ReasonRefused},
		{"https probe, plain HTTP gateway", httpsProbe, addr(plain.URL), ReasonProtocol},
		{"HTTP 503", httpProbe, addr(failing.URL), ReasonHTTPStatus},
		{"certificate not trusted", latency.TLSProber{Config: &tls.Config{}}, addr(selfSigned.URL), ReasonTLS},
		{"no answer", httpProbe, silent.Addr().String(), ReasonTimeout},
		{"hang-up", httpProbe, hangup.Addr().String(), ReasonReset},
	} {
		// Only the silent gateway should meet the deadline: the others get
		// a generous one, so a busy machine cannot turn them into timeouts.
		timeout := 10 * time.Second
		if tc.want == ReasonTimeout {
			timeout = 300 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := tc.prober.Probe(ctx, tc.addr)
		cancel()
		if got := Reason(err); got != tc.want {
			t.Errorf("%s: %v → %q, want %q", tc.name, err, got, tc.want)
		}
	}
	if Reason(nil) != "" {
		t.Error("nil error has a reason")
	}
}
