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
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
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
	// members, the one of lower latency per request × (requests in flight + 1)
	// (HTTP needs the latency_bucket transport, which counts them).
	Within string `json:"within,omitempty"`
	// Choices, with within p2c, is how many distinct random members of
	// the bucket a pick compares: a whole number of at least 2 (default
	// 2) or "all", every member: for small pools of unequal capacity.
	Choices string `json:"choices,omitempty"`

	// SlowStart, if set, gives a publisher that (re)enters the lowest
	// bucket a share of new picks rising linearly from 0 to its full share
	// over this long. Default 0: off.
	SlowStart caddy.Duration `json:"slow_start,omitempty"`

	// ORCA says whether within p2c (HTTP) reads the load each backend
	// reports in its answers (the endpoint-load-metrics header, TEXT, JSON
	// or BIN form) into its cost: "on" (default with within p2c) or "off".
	ORCA string `json:"orca,omitempty"`
	// ORCABlackout: a backend's reports are used once it has reported
	// without a break for this long (gRPC A58's blackout period). Default
	// 10s; 0 uses them at once.
	ORCABlackout *caddy.Duration `json:"orca_blackout,omitempty"`
	// ORCAExpiration: a report older than this is forgotten (A58's
	// expiration period). Default 3m.
	ORCAExpiration caddy.Duration `json:"orca_expiration,omitempty"`

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
	// UDPProbe measures the layer4 proxy's UDP upstreams (udp/host:port),
	// which Probe cannot: required when the proxy has one.
	UDPProbe *UDPProbe `json:"udp_probe,omitempty"`
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

	// LogDecisions (layer4 only) logs every pick as one structured line:
	// user, app, publisher, bucket, sticky or new, probe or traffic. HTTP
	// decisions go to the access log through log_append and the
	// placeholders instead. Default off.
	LogDecisions bool `json:"log_decisions,omitempty"`

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
	"orca":                 {"on", "off"},
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

// Validate checks every option and names the bad one: each value on its
// own first, then the options that depend on another option or the layer.
func (c *Config) Validate(layer4 bool) error {
	for _, check := range []func(layer4 bool) error{
		c.validateValues, c.validateTraffic, c.validateChoices, c.validateORCA, c.validateProbe, c.validateLayer, c.validateStore,
	} {
		if err := check(layer4); err != nil {
			return err
		}
	}
	return nil
}

// invalid is the error naming an option, its value, and why it is refused.
func invalid(opt string, v any, why string) error {
	return fmt.Errorf("latency_bucket: %s %v: %s", opt, v, why)
}

// validateValues checks each option's value on its own: the words against
// their choices, and the numbers that JSON (unlike the Caddyfile parser)
// lets through below their range.
func (c *Config) validateValues(bool) error {
	for _, o := range []struct{ opt, v string }{
		{"latency", c.Latency}, {"within", c.Within}, {"probe", c.Probe}, {"orca", c.ORCA},
		{"sticky", c.Sticky}, {"sticky_user_fallback", c.StickyUserFallback},
	} {
		if err := checkChoice(o.opt, o.v); err != nil {
			return invalid(o.opt, strconv.Quote(o.v), err.Error())
		}
	}
	for _, o := range []struct {
		opt string
		v   caddy.Duration
	}{
		{"traffic_half_life", c.TrafficHalfLife}, {"traffic_failure_latency", c.TrafficFailureLatency},
		{"slow_start", c.SlowStart}, {"bucket_width", c.BucketWidth}, {"probe_interval", c.ProbeInterval},
		{"probe_timeout", c.ProbeTimeout}, {"sticky_ttl", c.StickyTTL},
	} {
		if o.v < 0 {
			return invalid(o.opt, time.Duration(o.v), "must be positive")
		}
	}
	for _, o := range []struct {
		opt, why string
		v        int
	}{
		{"probes", "must be at least 1", c.Probes}, {"probe_window", "must be at least 1", c.ProbeWindow},
		{"sticky_max_entries", "must be positive", c.StickyMaxEntries},
	} {
		if o.v < 0 {
			return invalid(o.opt, o.v, o.why)
		}
	}
	if c.Hysteresis != nil && (*c.Hysteresis < 0 || *c.Hysteresis >= 1) {
		return invalid("hysteresis", *c.Hysteresis, "must be in [0, 1)")
	}
	for addr, d := range c.Segments {
		if d < 0 {
			return invalid("segment "+addr, time.Duration(d), "must not be negative")
		}
	}
	return nil
}

// validateTraffic refuses the observed latency's options where nothing
// uses it: only latency traffic and both, and within p2c's estimate, do.
func (c *Config) validateTraffic(bool) error {
	if c.source() != pubsel.FromProbe || c.Within == "p2c" {
		return nil
	}
	if c.TrafficHalfLife != 0 {
		return invalid("traffic_half_life", time.Duration(c.TrafficHalfLife), "applies to latency traffic or both, or within p2c, only")
	}
	if c.TrafficFailureLatency != 0 {
		return invalid("traffic_failure_latency", time.Duration(c.TrafficFailureLatency), "applies to latency traffic or both, or within p2c, only")
	}
	return nil
}

// validateChoices checks choices, which within p2c alone reads.
func (c *Config) validateChoices(bool) error {
	if c.Choices == "" {
		return nil
	}
	if _, err := choiceCount(c.Choices); err != nil {
		return invalid("choices", strconv.Quote(c.Choices), err.Error())
	}
	if c.Within != "p2c" {
		return invalid("choices", c.Choices, "applies to within p2c only")
	}
	return nil
}

// choiceCount is the engine's Selector.Choices for the value v of
// choices ("" is 2), or why v is refused.
func choiceCount(v string) (int, error) {
	switch v {
	case "":
		return 2, nil
	case "all":
		return pubsel.ChoicesAll, nil
	}
	n, err := cfvalue.Int(v, 2, math.MaxInt)
	if err != nil {
		return 0, errors.New(err.Error() + ", or all")
	}
	return n, nil
}

// validateProbe checks the options that only some probes take.
func (c *Config) validateProbe(layer4 bool) error {
	if (c.ProbePath != "" || c.ProbeHost != "") && c.Probe != "http" && c.Probe != "https" && c.Probe != "h2c" {
		return invalid("probe_path/probe_host", c.ProbePath+c.ProbeHost, "apply to http, https and h2c probes only")
	}
	if c.UDPProbe == nil {
		return nil
	}
	if !layer4 {
		return errors.New("latency_bucket: udp_probe: applies to layer4 proxies (HTTP upstreams are not UDP)")
	}
	_, err := c.UDPProbe.prober()
	return err
}

// validateLayer checks the options that one layer cannot honour.
func (c *Config) validateLayer(layer4 bool) error {
	if c.Within == "least_conn" && layer4 {
		return invalid("within", c.Within, "layer4 upstreams do not expose connection counts; use random or p2c")
	}
	if c.LogDecisions && !layer4 {
		return invalid("log_decisions", c.LogDecisions, "layer4 only; HTTP decisions go to the access log with log_append and the placeholders")
	}
	return nil
}

// validateStore checks the shared sticky store.
func (c *Config) validateStore(bool) error {
	ss := c.StickyStore
	switch {
	case ss == nil:
		return nil
	case ss.Redis == "":
		return invalid("sticky_store", `""`, "name a store: sticky_store redis <name>")
	case c.Sticky == "off":
		return invalid("sticky_store redis", ss.Redis, "needs sticky on")
	case ss.Timeout < 0:
		return invalid("sticky_store_timeout", time.Duration(ss.Timeout), "must be positive")
	case time.Duration(ss.Timeout) > maxStoreTimeout:
		return invalid("sticky_store_timeout", time.Duration(ss.Timeout), "must be at most 5s (it delays a request on a local miss)")
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
	if c.UDPProbe != nil {
		// Validated at load: a bad probe was refused before settings.
		udp, _ := c.UDPProbe.prober()
		prober = latency.Split{Stream: prober, Datagram: udp}
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
			ORCA:           c.orcaOn(),
			ORCAPeriods:    c.orcaPeriods(),
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

// choices is the engine's Selector.Choices (Validate has checked it).
func (c *Config) choices() int {
	n, _ := choiceCount(c.Choices)
	return n
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
	id := fmt.Sprintf("%s path=%q host=%q insecure=%v", kind, c.ProbePath, c.ProbeHost, c.ProbeInsecureSkipVerify)
	if u := c.UDPProbe; u != nil {
		id += fmt.Sprintf(" udp=%d/%q/%q/%q/%q", u.TCPPort, u.Request, u.RequestHex, u.Answer, u.AnswerHex)
	}
	return id
}
