package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// Measure is the reporter's run: every gateway probed probes times, one
// after another, each bounded by timeout; a gateway's lowest RTT is its
// measurement, as in the plugin's own probe runs, so a report and a
// run measure alike. progress, if set, is called per gateway
// as it finishes. Gateways are measured at once.
func Measure(ctx context.Context, gws []gatewayorder.Gateway, p latency.Prober, kind string, probes int, timeout time.Duration, progress func(gatewayorder.Gateway, latency.Result)) rttreports.Report {
	rep := rttreports.Report{Probe: kind, Measurements: make([]rttreports.Measurement, len(gws))}
	done := make(chan int)
	results := make([]latency.Result, len(gws))
	for i, g := range gws {
		go func() {
			results[i] = latency.Measure(ctx, p, g.Addr, probes, timeout)
			done <- i
		}()
	}
	for range gws {
		i := <-done
		r := results[i]
		rep.Measurements[i] = rttreports.Measurement{Gateway: gws[i].Name, RTT: r.Best, Failed: r.OK == 0}
		if progress != nil {
			progress(gws[i], r)
		}
	}
	rep.At = time.Now()
	return rep
}

// SendReport POSTs body to url with the bearer token, from localAddr when
// set (an IP), following no redirect, reading at most 64 KiB of the answer.
// It returns the status and the answer's error reason and detail, if any.
func SendReport(ctx context.Context, url, token, localAddr string, body []byte) (status int, reason, detail string, err error) {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if localAddr != "" {
		ip := net.ParseIP(localAddr)
		if ip == nil {
			return 0, "", "", fmt.Errorf("source %q: not an IP address", localAddr)
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	client := &http.Client{
		Transport:     &http.Transport{DialContext: dialer.DialContext, Proxy: http.ProxyFromEnvironment},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	var a struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	json.Unmarshal(data, &a)
	return resp.StatusCode, a.Error, a.Detail, nil
}
