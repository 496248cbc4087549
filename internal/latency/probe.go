package latency

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"time"
)

// A Prober measures one round trip to addr (host:port).
type Prober interface {
	Probe(ctx context.Context, addr string) (time.Duration, error)
}

// TCPProber times a TCP connect: the SYN to SYN-ACK round trip.
type TCPProber struct{}

func (TCPProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	var d net.Dialer
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	rtt := time.Since(start)
	if err != nil {
		return 0, err
	}
	c.Close()
	return rtt, nil
}

// TLSProber times a TLS handshake over a fresh TCP connection, excluding the
// connect. Config may be nil; ServerName defaults to addr's host.
type TLSProber struct {
	Config *tls.Config
}

func (p TLSProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer raw.Close()
	cfg := p.Config.Clone()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	conn := tls.Client(raw, cfg)
	start := time.Now()
	err = conn.HandshakeContext(ctx)
	rtt := time.Since(start)
	if err != nil {
		return 0, err
	}
	return rtt, nil
}

// HTTPProber sends GET Scheme://addr/Path, over HTTP/1.1 (or HTTP/2 when a
// TLS server offers it) for "http" and "https", and over HTTP/2 with prior
// knowledge, no TLS, for "h2c": the only protocol of h2c-only servers such
// as grpc-go's, which do not answer HTTP/1.1. By default it reuses connections
// and times from the request written to the first response byte, one round
// trip plus the server's think time. With FreshConnection it opens a new
// connection for every probe and times the whole exchange, from the SYN to
// the end of the response body. A response with status 500 or above is a
// failed probe, unless AnyStatus: then any response completes the probe
// (AnyConnect's OGS counts the answer itself, not a successful one).
type HTTPProber struct {
	Client          *http.Client // nil: a client built from TLS and FreshConnection
	Scheme          string       // "http" (default), "https" or "h2c"
	Path            string       // default "/"
	Host            string       // Host header; default addr
	FreshConnection bool
	AnyStatus       bool
}

// NewHTTPProber returns an HTTPProber with its own transport.
func NewHTTPProber(scheme, path, host string, tlsConfig *tls.Config, fresh bool) *HTTPProber {
	tr := &http.Transport{
		TLSClientConfig:     tlsConfig,
		DisableKeepAlives:   fresh,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	if scheme == "h2c" {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &HTTPProber{
		Client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		Scheme: scheme, Path: path, Host: host, FreshConnection: fresh,
	}
}

// CloseIdleConnections closes the kept-alive probe connections of a prober
// no longer in use (its policy reloaded with a new one, or stopped).
func (p *HTTPProber) CloseIdleConnections() {
	if p.Client != nil {
		p.Client.CloseIdleConnections()
	}
}

func (p *HTTPProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	scheme, path := p.Scheme, p.Path
	if scheme == "" || scheme == "h2c" {
		scheme = "http"
	}
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	if p.Host != "" {
		req.Host = p.Host
	}
	var wrote, firstByte time.Time
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote = time.Now() },
		GotFirstResponseByte: func() { firstByte = time.Now() },
	}))
	client := p.Client
	if client == nil {
		client = http.DefaultClient
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	end := time.Now()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode >= 500 && !p.AnyStatus {
		return 0, fmt.Errorf("probe answered %s", resp.Status)
	}
	if p.FreshConnection {
		return end.Sub(start), nil
	}
	if wrote.IsZero() || firstByte.Before(wrote) {
		return firstByte.Sub(start), nil
	}
	return firstByte.Sub(wrote), nil
}

// Result is the outcome of Measure: every probe's RTT (0 for a failure), the
// lowest successful one, and the last error when none succeeded.
type Result struct {
	RTTs []time.Duration
	Best time.Duration
	OK   int
	Err  error
}

// Measure runs n probes to addr one after another, each bounded by timeout
// and all by ctx, and keeps the lowest RTT.
func Measure(ctx context.Context, p Prober, addr string, n int, timeout time.Duration) Result {
	r := Result{RTTs: make([]time.Duration, 0, n)}
	for i := 0; i < n; i++ {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		rtt, err := p.Probe(pctx, addr)
		cancel()
		if err != nil {
			r.Err = err
			r.RTTs = append(r.RTTs, 0)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		r.RTTs = append(r.RTTs, rtt)
		if r.OK == 0 || rtt < r.Best {
			r.Best = rtt
		}
		r.OK++
	}
	if r.OK > 0 {
		r.Err = nil
	} else if r.Err == nil {
		r.Err = errors.New("no probe ran")
	}
	return r
}
