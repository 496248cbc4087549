package latency

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestTCPProberConnectsAndFailsOnClosedPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if _, err := (TCPProber{}).Probe(context.Background(), addr); err != nil {
		t.Fatalf("probe to a listener: %v", err)
	}
	l.Close()
	if _, err := (TCPProber{}).Probe(context.Background(), addr); err == nil {
		t.Fatal("probe to a closed port succeeded")
	}
}

// The HTTP probe's RTT includes the server's real delay, and a 5xx fails.
func TestHTTPProberMeasuresDelayAndStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		time.Sleep(30 * time.Millisecond)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, fresh := range []bool{false, true} {
		p := NewHTTPProber("http", "/slow", "", nil, fresh)
		rtt, err := p.Probe(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		if rtt < 30*time.Millisecond {
			t.Errorf("fresh=%v: rtt %v is below the server's 30 ms delay", fresh, rtt)
		}
	}
	if _, err := NewHTTPProber("http", "/down", "", nil, false).Probe(context.Background(), addr); err == nil {
		t.Fatal("a 503 counted as a successful probe")
	}
	any := NewHTTPProber("http", "/down", "", nil, true)
	any.AnyStatus = true
	if _, err := any.Probe(context.Background(), addr); err != nil {
		t.Fatalf("AnyStatus: a 503 failed the probe: %v", err)
	}
}

// An h2c-only server (HTTP/2 without TLS, like grpc-go's) answers the h2c
// probe over HTTP/2, and not the http probe, which speaks HTTP/1.1.
func TestHTTPProberH2C(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var proto string
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto = r.Proto
		time.Sleep(20 * time.Millisecond)
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(l)
	defer srv.Close()
	addr := l.Addr().String()
	rtt, err := NewHTTPProber("h2c", "/probe", "", nil, false).Probe(context.Background(), addr)
	if err != nil || proto != "HTTP/2.0" || rtt < 20*time.Millisecond {
		t.Fatalf("h2c probe: rtt %v, err %v, server saw %q", rtt, err, proto)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := NewHTTPProber("http", "/probe", "", nil, false).Probe(ctx, addr); err == nil {
		t.Fatal("an HTTP/1.1 probe succeeded against an h2c-only server")
	}
}

func TestTLSProberHandshakes(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	if _, err := (TLSProber{Config: &tls.Config{InsecureSkipVerify: true}}).Probe(context.Background(), addr); err != nil {
		t.Fatal(err)
	}
	if _, err := (TLSProber{}).Probe(context.Background(), addr); err == nil {
		t.Fatal("handshake with an untrusted certificate succeeded")
	}
}

type scripted struct {
	rtts []time.Duration // 0 = failure
	i    int
}

func (s *scripted) Probe(context.Context, string) (time.Duration, error) {
	d := s.rtts[s.i%len(s.rtts)]
	s.i++
	if d == 0 {
		return 0, net.ErrClosed
	}
	return d, nil
}

func TestMeasureKeepsTheLowestRTT(t *testing.T) {
	r := Measure(context.Background(), &scripted{rtts: []time.Duration{302 * ms, 0, 132 * ms}}, "x", 3, time.Second)
	if r.Err != nil || r.Best != 132*ms || r.OK != 2 || len(r.RTTs) != 3 {
		t.Fatalf("%+v", r)
	}
	r = Measure(context.Background(), &scripted{rtts: []time.Duration{0}}, "x", 3, time.Second)
	if r.Err == nil || r.OK != 0 {
		t.Fatalf("all failed but %+v", r)
	}
}
