// Package latencybucket provides the latency_bucket selection policy for
// Caddy's reverse_proxy (http.reverse_proxy.selection_policies.latency_bucket)
// and caddy-l4's proxy (layer4.proxy.selection_policies.latency_bucket): the
// publisher selection of Netskope NPA. The algorithm lives in internal/pubsel;
// this package adapts it: config, Caddyfile, placeholders, metrics, admin API.
package latencybucket

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// Config is the configuration shared by the HTTP and layer4 policies.
type Config struct {
	// Name identifies this policy's state (probe measurements, sticky
	// pins), which outlives a config reload: a new config whose policy has
	// the same name (and kind) adopts it. It also labels metrics and the
	// admin API. Default: derived from the kind, the upstreams and a hash of
	// the upstreams and every setting, e.g. "http:10.0.0.1:443+2~1f2e3d4c".
	Name string `json:"name,omitempty"`

	// Latency says what publishers are bucketed by: "probe" (default; "on"
	// is the same) the probe latency; "traffic" the latency observed on real
	// requests (HTTP: time to response headers, through the latency_bucket
	// transport; layer4: connect time), the probes keeping idle publishers
	// measured and finding dead ones; "both" the higher of the two. "off"
	// drops the buckets: balance over every active publisher, still sticky.
	Latency string `json:"latency,omitempty"`
	// TrafficHalfLife is the half-life with which the observed latency
	// (a peak-EWMA) decays after a slow spell. Default 10s. For latency
	// traffic or both, or within p2c (its latency estimate).
	TrafficHalfLife caddy.Duration `json:"traffic_half_life,omitempty"`
	// TrafficFailureLatency is what a failed or timed-out real request
	// counts as (at least). Default: probe_timeout.
	TrafficFailureLatency caddy.Duration `json:"traffic_failure_latency,omitempty"`
	// BucketWidth is w in the buckets [0,w), [w,2w), [2w,4w)… Default 32ms.
	BucketWidth caddy.Duration `json:"bucket_width,omitempty"`
	// Hysteresis: a publisher leaves its bucket only once its latency is
	// this fraction past the bucket's bounds. Default 0.1; 0 disables.
	Hysteresis *float64 `json:"hysteresis,omitempty"`
	// Within is how a publisher is picked inside the bucket: "random"
	// (default), "least_conn" (HTTP only), or "p2c": of two random
	// members, the one of lower latency estimate × (requests in flight + 1)
	// (HTTP needs the latency_bucket transport, which counts them).
	Within string `json:"within,omitempty"`

	// SlowStart, if set, gives a publisher that (re)enters the lowest
	// bucket a share of new picks rising linearly from 0 to its full share
	// over this long. Default 0: off.
	SlowStart caddy.Duration `json:"slow_start,omitempty"`

	// Probe is the probe kind: "tcp" (connect time, default), "tls"
	// (handshake time), "http" or "https" (request to first response byte),
	// or "h2c" (the same over HTTP/2 without TLS, for h2c-only upstreams
	// such as gRPC servers).
	Probe string `json:"probe,omitempty"`
	// ProbePath and ProbeHost are the request path and Host of http(s) probes.
	ProbePath string `json:"probe_path,omitempty"`
	ProbeHost string `json:"probe_host,omitempty"`
	// ProbeInsecureSkipVerify skips certificate checks of tls and https probes
	// (they measure latency, not trust).
	ProbeInsecureSkipVerify bool `json:"probe_insecure_skip_verify,omitempty"`
	// Probes per round (default 3), ProbeInterval between rounds (default
	// 10s), ProbeTimeout per probe (default 2s), ProbeWindow: how many
	// rounds the minimum is taken over (default 3).
	Probes        int            `json:"probes,omitempty"`
	ProbeInterval caddy.Duration `json:"probe_interval,omitempty"`
	ProbeTimeout  caddy.Duration `json:"probe_timeout,omitempty"`
	ProbeWindow   int            `json:"probe_window,omitempty"`

	// Segments adds a static latency per upstream dial address (host:port),
	// for a leg the probes do not cross.
	Segments map[string]caddy.Duration `json:"segments,omitempty"`

	// Sticky is "on" (default) or "off".
	Sticky string `json:"sticky,omitempty"`
	// StickyUser and StickyApp are placeholders naming the user and the
	// app. Defaults: HTTP, the client IP and the request host; layer4, the
	// remote IP and the local (listener) address.
	StickyUser string `json:"sticky_user,omitempty"`
	StickyApp  string `json:"sticky_app,omitempty"`
	// StickyUserFallback says what a request or connection whose
	// StickyUser placeholder is empty (a header it lacks) is pinned by:
	// "client_ip" (default), its client IP as if StickyUser were unset; or
	// "none", not pinned at all (a fresh pick each time). Without it every
	// such client would share one empty user, and so one pin.
	StickyUserFallback string `json:"sticky_user_fallback,omitempty"`
	// StickyTTL forgets a pair idle this long (default 1h); StickyMaxEntries
	// bounds the table (default 100000; least recently used go first).
	StickyTTL        caddy.Duration `json:"sticky_ttl,omitempty"`
	StickyMaxEntries int            `json:"sticky_max_entries,omitempty"`

	// StickyStore shares the sticky pins of a cluster of replicas through
	// a store: the local table stays the first level, the store is read on
	// a local miss and written on a new pick. Default: none (local only).
	StickyStore *StickyStore `json:"sticky_store,omitempty"`
}

// StickyStore names the shared store of sticky pins.
type StickyStore struct {
	// Redis is the name of a connection declared in the edgesteer_redis
	// app (Caddyfile: the edgesteer_redis global option).
	Redis string `json:"redis,omitempty"`
	// Timeout bounds each store call on a request's path: the read on a
	// local miss and the write of a new pick. Default 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// choices lists the words an option of a few values takes (empty means
// the first); the Caddyfile parser and Validate both check against it.
var choices = map[string][]string{
	"latency":              {"probe", "traffic", "both", "on", "off"},
	"within":               {"random", "least_conn", "p2c"},
	"probe":                {"tcp", "tls", "http", "https", "h2c"},
	"sticky":               {"on", "off"},
	"sticky_user_fallback": {"client_ip", "none"},
}

// checkChoice says why v is not one of opt's choices, or nil.
func checkChoice(opt, v string) error {
	words := choices[opt]
	if v == "" || slices.Contains(words, v) {
		return nil
	}
	return errors.New("want " + strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1])
}

const (
	defaultStickyTTL        = time.Hour
	defaultStickyMaxEntries = 100_000
)

// Validate checks every option and names the bad one.
func (c *Config) Validate(layer4 bool) error {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("latency_bucket: %s %v: %s", opt, v, why)
	}
	for _, o := range []struct{ opt, v string }{
		{"latency", c.Latency}, {"within", c.Within}, {"probe", c.Probe},
		{"sticky", c.Sticky}, {"sticky_user_fallback", c.StickyUserFallback},
	} {
		if err := checkChoice(o.opt, o.v); err != nil {
			return bad(o.opt, strconv.Quote(o.v), err.Error())
		}
	}
	if c.TrafficHalfLife < 0 {
		return bad("traffic_half_life", time.Duration(c.TrafficHalfLife), "must be positive")
	}
	if c.TrafficFailureLatency < 0 {
		return bad("traffic_failure_latency", time.Duration(c.TrafficFailureLatency), "must be positive")
	}
	// The observed latency is used by latency traffic and both, and by
	// within p2c's estimate; elsewhere these options would do nothing.
	usesTraffic := c.source() != pubsel.FromProbe || c.Within == "p2c"
	if !usesTraffic && c.TrafficHalfLife != 0 {
		return bad("traffic_half_life", time.Duration(c.TrafficHalfLife), "applies to latency traffic or both, or within p2c, only")
	}
	if !usesTraffic && c.TrafficFailureLatency != 0 {
		return bad("traffic_failure_latency", time.Duration(c.TrafficFailureLatency), "applies to latency traffic or both, or within p2c, only")
	}
	if c.SlowStart < 0 {
		return bad("slow_start", time.Duration(c.SlowStart), "must be positive")
	}
	if c.BucketWidth < 0 {
		return bad("bucket_width", time.Duration(c.BucketWidth), "must be positive")
	}
	if c.Hysteresis != nil && (*c.Hysteresis < 0 || *c.Hysteresis >= 1) {
		return bad("hysteresis", *c.Hysteresis, "must be in [0, 1)")
	}
	if c.Within == "least_conn" && layer4 {
		return bad("within", c.Within, "layer4 upstreams do not expose connection counts; use random or p2c")
	}
	if (c.ProbePath != "" || c.ProbeHost != "") && c.Probe != "http" && c.Probe != "https" && c.Probe != "h2c" {
		return bad("probe_path/probe_host", c.ProbePath+c.ProbeHost, "apply to http, https and h2c probes only")
	}
	if c.Probes < 0 {
		return bad("probes", c.Probes, "must be at least 1")
	}
	if c.ProbeInterval < 0 {
		return bad("probe_interval", time.Duration(c.ProbeInterval), "must be positive")
	}
	if c.ProbeTimeout < 0 {
		return bad("probe_timeout", time.Duration(c.ProbeTimeout), "must be positive")
	}
	if c.ProbeWindow < 0 {
		return bad("probe_window", c.ProbeWindow, "must be at least 1")
	}
	for addr, d := range c.Segments {
		if d < 0 {
			return bad("segment "+addr, time.Duration(d), "must not be negative")
		}
	}
	if c.StickyTTL < 0 {
		return bad("sticky_ttl", time.Duration(c.StickyTTL), "must be positive")
	}
	if c.StickyMaxEntries < 0 {
		return bad("sticky_max_entries", c.StickyMaxEntries, "must be positive")
	}
	if ss := c.StickyStore; ss != nil {
		if ss.Redis == "" {
			return bad("sticky_store", `""`, "name a store: sticky_store redis <name>")
		}
		if c.Sticky == "off" {
			return bad("sticky_store redis", ss.Redis, "needs sticky on")
		}
		if ss.Timeout < 0 {
			return bad("sticky_store_timeout", time.Duration(ss.Timeout), "must be positive")
		}
		if time.Duration(ss.Timeout) > maxStoreTimeout {
			return bad("sticky_store_timeout", time.Duration(ss.Timeout), "must be at most 5s (it delays a request on a local miss)")
		}
	}
	return nil
}

// maxStoreTimeout caps sticky_store_timeout: each local miss may wait this
// long twice (read, then write of a new pick).
const maxStoreTimeout = 5 * time.Second

// settings turns the config into the engine's, defaults filled in.
func (c *Config) settings() pubsel.Settings {
	h := pubsel.DefaultHysteresis
	if c.Hysteresis != nil {
		h = *c.Hysteresis
	}
	segs := make(map[string]time.Duration, len(c.Segments))
	for addr, d := range c.Segments {
		segs[addr] = time.Duration(d)
	}
	var prober latency.Prober = latency.TCPProber{}
	tlsCfg := &tls.Config{InsecureSkipVerify: c.ProbeInsecureSkipVerify} //nolint:gosec // opt-in, latency only
	switch c.Probe {
	case "tls":
		prober = latency.TLSProber{Config: tlsCfg}
	case "http", "https", "h2c":
		prober = latency.NewHTTPProber(c.Probe, c.ProbePath, c.ProbeHost, tlsCfg, false)
	}
	s := pubsel.Settings{
		Tracker: pubsel.Config{
			BucketWidth:    time.Duration(c.BucketWidth),
			NoBuckets:      c.Latency == "off",
			Hysteresis:     h,
			Probes:         c.Probes,
			Interval:       time.Duration(c.ProbeInterval),
			Timeout:        time.Duration(c.ProbeTimeout),
			Window:         c.ProbeWindow,
			Prober:         prober,
			ProbeID:        c.probeID(),
			Segments:       segs,
			Source:         c.source(),
			HalfLife:       time.Duration(c.TrafficHalfLife),
			FailureLatency: time.Duration(c.TrafficFailureLatency),
		},
		Sticky:           c.Sticky != "off",
		StickyTTL:        time.Duration(c.StickyTTL),
		StickyMaxEntries: c.StickyMaxEntries,
	}
	if s.StickyTTL == 0 {
		s.StickyTTL = defaultStickyTTL
	}
	if s.StickyMaxEntries == 0 {
		s.StickyMaxEntries = defaultStickyMaxEntries
	}
	return s
}

// within is the engine's pick rule inside the lowest bucket.
func (c *Config) within() pubsel.Within {
	switch c.Within {
	case "least_conn":
		return pubsel.WithinLeastConn
	case "p2c":
		return pubsel.WithinP2C
	}
	return pubsel.WithinRandom
}

// source is the latency the buckets are computed from.
func (c *Config) source() pubsel.Source {
	switch c.Latency {
	case "traffic":
		return pubsel.FromTraffic
	case "both":
		return pubsel.FromBoth
	}
	return pubsel.FromProbe
}

// probeID names what the probes measure. Rounds taken with another kind,
// path, Host or verification are not comparable: a reload that changes
// any of them forgets the measurements (pins stay).
func (c *Config) probeID() string {
	kind := c.Probe
	if kind == "" {
		kind = "tcp"
	}
	return fmt.Sprintf("%s path=%q host=%q insecure=%v", kind, c.ProbePath, c.ProbeHost, c.ProbeInsecureSkipVerify)
}
