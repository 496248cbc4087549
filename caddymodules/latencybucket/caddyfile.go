package latencybucket

import (
	"errors"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

// UnmarshalCaddyfile reads
//
//	lb_policy latency_bucket {
//		name <name>
//		latency probe|traffic|both|off     # "on" is probe
//		traffic_half_life <duration>
//		traffic_failure_latency <duration>
//		bucket_width <duration>
//		hysteresis <fraction>
//		within random|least_conn|p2c
//		slow_start <duration>
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
//		sticky_store redis <store name>
//		sticky_store_timeout <duration>
//	}
//
// segment is given once per upstream address; every other option once.
// Durations other than a segment's must be positive: in JSON zero means
// "default", so a Caddyfile zero is surely a mistake.
func (c *Config) UnmarshalCaddyfile(d *caddyfile.Dispenser) (err error) {
	_, o, err := cfparse.Open(d, "latency_bucket", 0, 0)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil && c.StickyStore != nil && c.StickyStore.Redis == "" {
			err = d.Errf("latency_bucket: sticky_store_timeout needs sticky_store redis <name>")
		}
	}()
	for o.Next() {
		switch o.Name() {
		case "name":
			c.Name, err = o.String()
		case "latency":
			c.Latency, err = choice(o)
		case "traffic_half_life":
			c.TrafficHalfLife, err = o.Duration(time.Nanosecond)
		case "traffic_failure_latency":
			c.TrafficFailureLatency, err = o.Duration(time.Nanosecond)
		case "bucket_width":
			c.BucketWidth, err = o.Duration(time.Nanosecond)
		case "hysteresis":
			c.Hysteresis, err = hysteresis(o)
		case "within":
			c.Within, err = choice(o)
		case "slow_start":
			c.SlowStart, err = o.Duration(time.Nanosecond)
		case "probe":
			err = c.unmarshalProbe(o)
		case "probe_host":
			c.ProbeHost, err = o.String()
		case "probe_insecure_skip_verify":
			err = o.Flag()
			c.ProbeInsecureSkipVerify = err == nil
		case "probes":
			c.Probes, err = o.Int(1, math.MaxInt)
		case "probe_interval":
			c.ProbeInterval, err = o.Duration(time.Nanosecond)
		case "probe_timeout":
			c.ProbeTimeout, err = o.Duration(time.Nanosecond)
		case "probe_window":
			c.ProbeWindow, err = o.Int(1, math.MaxInt)
		case "segment":
			err = c.unmarshalSegment(o)
		case "sticky":
			c.Sticky, err = choice(o)
		case "sticky_user":
			c.StickyUser, err = o.String()
		case "sticky_user_fallback":
			c.StickyUserFallback, err = choice(o)
		case "sticky_app":
			c.StickyApp, err = o.String()
		case "sticky_ttl":
			c.StickyTTL, err = o.Duration(time.Nanosecond)
		case "sticky_max_entries":
			c.StickyMaxEntries, err = o.Int(1, math.MaxInt)
		case "sticky_store":
			err = c.unmarshalStore(o)
		case "sticky_store_timeout":
			var d caddy.Duration
			if d, err = o.Duration(time.Millisecond); err == nil {
				if c.StickyStore == nil {
					c.StickyStore = &StickyStore{}
				}
				c.StickyStore.Timeout = d
			}
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalStore reads "sticky_store redis <name>".
func (c *Config) unmarshalStore(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(2, 2)
	if err != nil {
		return err
	}
	if args[0] != "redis" {
		return o.Invalid(args[0], errors.New("want redis"))
	}
	if c.StickyStore == nil {
		c.StickyStore = &StickyStore{}
	}
	c.StickyStore.Redis = args[1]
	return nil
}

// choice reads an option given once with one of its choices.
func choice(o *cfparse.Block) (string, error) {
	s, err := o.String()
	if err != nil {
		return "", err
	}
	if err := checkChoice(o.Name(), s); err != nil {
		return "", o.Invalid(s, err)
	}
	return s, nil
}

// hysteresis reads a fraction in [0, 1): 1 would keep a publisher in its
// bucket whatever its latency.
func hysteresis(o *cfparse.Block) (*float64, error) {
	s, err := o.String()
	if err != nil {
		return nil, err
	}
	h, err := cfparse.Float(s, 0, 1)
	if err != nil || h == 1 {
		return nil, o.Invalid(s, errors.New("want a decimal number of at least 0 and below 1"))
	}
	return &h, nil
}

// unmarshalProbe reads "probe <kind> [<path>]"; a path only for the kinds
// that send a request.
func (c *Config) unmarshalProbe(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(1, 2)
	if err != nil {
		return err
	}
	if err := checkChoice("probe", args[0]); err != nil {
		return o.Invalid(args[0], err)
	}
	c.Probe = args[0]
	if len(args) == 2 {
		if c.Probe != "http" && c.Probe != "https" && c.Probe != "h2c" {
			return o.Errf("%s %s: a path applies to http, https and h2c probes only", args[0], args[1])
		}
		c.ProbePath = args[1]
	}
	return nil
}

// unmarshalSegment reads "segment <address> <duration>", once per address.
func (c *Config) unmarshalSegment(o *cfparse.Block) error {
	args, err := o.Args(2, 2)
	if err != nil {
		return err
	}
	addr, s := args[0], args[1]
	if err := o.OnceFor(addr); err != nil {
		return err
	}
	v, err := cfparse.Duration(s, 0)
	if err != nil {
		return o.Dispenser().Errf("latency_bucket: segment %s %q: %v", addr, s, err)
	}
	if c.Segments == nil {
		c.Segments = map[string]caddy.Duration{}
	}
	c.Segments[addr] = caddy.Duration(v)
	return nil
}
