// Package latencybucket provides the latency_bucket selection policy for
// Caddy's reverse_proxy (http.reverse_proxy.selection_policies.latency_bucket)
// and caddy-l4's proxy (layer4.proxy.selection_policies.latency_bucket): the
// publisher selection of Netskope NPA. The algorithm lives in internal/pubsel;
// this package adapts it: config, Caddyfile, placeholders, metrics, admin API.
package latencybucket

import (
	"crypto/tls"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

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

	// Latency is "on" (default): pick from the lowest latency bucket; or
	// "off": balance over every active publisher, still sticky.
	Latency string `json:"latency,omitempty"`
	// BucketWidth is w in the buckets [0,w), [w,2w), [2w,4w)… Default 32ms.
	BucketWidth caddy.Duration `json:"bucket_width,omitempty"`
	// Hysteresis: a publisher leaves its bucket only once its latency is
	// this fraction past the bucket's bounds. Default 0.1; 0 disables.
	Hysteresis *float64 `json:"hysteresis,omitempty"`
	// Within is how a publisher is picked inside the bucket: "random"
	// (default) or "least_conn" (HTTP only).
	Within string `json:"within,omitempty"`

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
	switch c.Latency {
	case "", "on", "off":
	default:
		return bad("latency", strconv.Quote(c.Latency), "want on or off")
	}
	if c.BucketWidth < 0 {
		return bad("bucket_width", time.Duration(c.BucketWidth), "must be positive")
	}
	if c.Hysteresis != nil && (*c.Hysteresis < 0 || *c.Hysteresis >= 1) {
		return bad("hysteresis", *c.Hysteresis, "must be in [0, 1)")
	}
	switch c.Within {
	case "", "random":
	case "least_conn":
		if layer4 {
			return bad("within", c.Within, "layer4 upstreams do not expose connection counts; use random")
		}
	default:
		return bad("within", strconv.Quote(c.Within), "want random or least_conn")
	}
	switch c.Probe {
	case "", "tcp", "tls", "http", "https", "h2c":
	default:
		return bad("probe", strconv.Quote(c.Probe), "unknown probe kind; want tcp, tls, http, https or h2c")
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
	switch c.Sticky {
	case "", "on", "off":
	default:
		return bad("sticky", strconv.Quote(c.Sticky), "want on or off")
	}
	switch c.StickyUserFallback {
	case "", "client_ip", "none":
	default:
		return bad("sticky_user_fallback", strconv.Quote(c.StickyUserFallback), "want client_ip or none")
	}
	if c.StickyTTL < 0 {
		return bad("sticky_ttl", time.Duration(c.StickyTTL), "must be positive")
	}
	if c.StickyMaxEntries < 0 {
		return bad("sticky_max_entries", c.StickyMaxEntries, "must be positive")
	}
	return nil
}

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
			BucketWidth: time.Duration(c.BucketWidth),
			NoBuckets:   c.Latency == "off",
			Hysteresis:  h,
			Probes:      c.Probes,
			Interval:    time.Duration(c.ProbeInterval),
			Timeout:     time.Duration(c.ProbeTimeout),
			Window:      c.ProbeWindow,
			Prober:      prober,
			ProbeID:     c.probeID(),
			Segments:    segs,
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

// UnmarshalCaddyfile reads
//
//	lb_policy latency_bucket {
//		name <name>
//		latency on|off
//		bucket_width <duration>
//		hysteresis <fraction>
//		within random|least_conn
//		probe tcp|tls|http|https|h2c [<path>]
//		probe_host <host>
//		probe_insecure_skip_verify
//		probes <count>
//		probe_interval <duration>
//		probe_timeout <duration>
//		probe_window <rounds>
//		segment <upstream host:port> <duration>
//		sticky on|off
//		sticky_user <placeholder>
//		sticky_user_fallback client_ip|none
//		sticky_app <placeholder>
//		sticky_ttl <duration>
//		sticky_max_entries <count>
//	}
func (c *Config) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		var err error
		switch opt {
		case "name":
			err = oneArg(d, &c.Name)
		case "latency":
			err = oneArg(d, &c.Latency)
		case "bucket_width":
			err = durationArg(d, &c.BucketWidth)
		case "hysteresis":
			var s string
			if err = oneArg(d, &s); err == nil {
				var h float64
				if h, err = strconv.ParseFloat(s, 64); err != nil {
					return d.Errf("hysteresis %q: not a number", s)
				}
				c.Hysteresis = &h
			}
		case "within":
			err = oneArg(d, &c.Within)
		case "probe":
			if !d.NextArg() {
				return d.ArgErr()
			}
			c.Probe = d.Val()
			if d.NextArg() {
				c.ProbePath = d.Val()
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "probe_host":
			err = oneArg(d, &c.ProbeHost)
		case "probe_insecure_skip_verify":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.ProbeInsecureSkipVerify = true
		case "probes":
			err = intArg(d, &c.Probes)
		case "probe_interval":
			err = durationArg(d, &c.ProbeInterval)
		case "probe_timeout":
			err = durationArg(d, &c.ProbeTimeout)
		case "probe_window":
			err = intArg(d, &c.ProbeWindow)
		case "segment":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(args[1])
			if perr != nil || dur < 0 {
				return d.Errf("latency_bucket: segment %s %q: want a duration of zero or more", args[0], args[1])
			}
			if c.Segments == nil {
				c.Segments = map[string]caddy.Duration{}
			}
			c.Segments[args[0]] = caddy.Duration(dur)
		case "sticky":
			err = oneArg(d, &c.Sticky)
		case "sticky_user":
			err = oneArg(d, &c.StickyUser)
		case "sticky_user_fallback":
			err = oneArg(d, &c.StickyUserFallback)
		case "sticky_app":
			err = oneArg(d, &c.StickyApp)
		case "sticky_ttl":
			err = durationArg(d, &c.StickyTTL)
		case "sticky_max_entries":
			err = intArg(d, &c.StickyMaxEntries)
		default:
			return d.Errf("latency_bucket: unknown option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// oneArg reads exactly one argument into dst.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// durationArg reads one positive duration (in JSON zero means "default", so
// a Caddyfile zero is surely a mistake).
func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("latency_bucket: %s %q: %v", opt, s, err)
	}
	if v <= 0 {
		return d.Errf("latency_bucket: %s %s: must be positive", opt, s)
	}
	*dst = caddy.Duration(v)
	return nil
}

func intArg(d *caddyfile.Dispenser, dst *int) error {
	opt := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return d.Errf("latency_bucket: %s %q: not a whole number", opt, s)
	}
	if v < 1 {
		return d.Errf("latency_bucket: %s %d: must be at least 1", opt, v)
	}
	*dst = v
	return nil
}
