package latencybucket

import (
	"errors"
	"fmt"
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
//		choices <count>|all          # within p2c: members compared, default 2
//		slow_start <duration>
//		orca on|off                  # within p2c, HTTP: default on
//		orca_blackout <duration>     # default 10s
//		orca_expiration <duration>   # default 3m
//		probe tcp|tls|http|https|h2c [<path>]
//		probe_host <host>
//		udp_probe tcp <port> | udp <request> [<answer>] | udp_hex <request> [<answer>]
//		log_decisions
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
// Most options set one field (optionFields), read by its type (readField);
// the rest have parsers of their own (optionParsers).
func (c *Config) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "latency_bucket", 0, 0)
	if err != nil {
		return err
	}
	fields := c.optionFields()
	for o.Next() {
		if parse, ok := optionParsers[o.Name()]; ok {
			err = parse(c, o)
		} else if field, ok := fields[o.Name()]; ok {
			err = readField(o, field)
		} else {
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	if c.StickyStore != nil && c.StickyStore.Redis == "" {
		return d.Errf("latency_bucket: sticky_store_timeout needs sticky_store redis <name>")
	}
	return nil
}

// optionFields maps each option that sets one field of c, from one value
// given once, to that field; readField reads the value by the field's type.
func (c *Config) optionFields() map[string]any {
	return map[string]any{
		"name":                       &c.Name,
		"latency":                    &c.Latency,
		"traffic_half_life":          &c.TrafficHalfLife,
		"traffic_failure_latency":    &c.TrafficFailureLatency,
		"bucket_width":               &c.BucketWidth,
		"hysteresis":                 &c.Hysteresis,
		"within":                     &c.Within,
		"slow_start":                 &c.SlowStart,
		"orca":                       &c.ORCA,
		"orca_blackout":              &c.ORCABlackout,
		"orca_expiration":            &c.ORCAExpiration,
		"probe_host":                 &c.ProbeHost,
		"probe_insecure_skip_verify": &c.ProbeInsecureSkipVerify,
		"log_decisions":              &c.LogDecisions,
		"probes":                     &c.Probes,
		"probe_interval":             &c.ProbeInterval,
		"probe_timeout":              &c.ProbeTimeout,
		"probe_window":               &c.ProbeWindow,
		"sticky":                     &c.Sticky,
		"sticky_user":                &c.StickyUser,
		"sticky_user_fallback":       &c.StickyUserFallback,
		"sticky_app":                 &c.StickyApp,
		"sticky_ttl":                 &c.StickyTTL,
		"sticky_max_entries":         &c.StickyMaxEntries,
	}
}

// optionParsers read the options that take several arguments, repeat per
// key, or fill a nested struct.
var optionParsers = map[string]func(*Config, *cfparse.Block) error{
	"choices":              (*Config).unmarshalChoices,
	"probe":                (*Config).unmarshalProbe,
	"udp_probe":            (*Config).unmarshalUDPProbe,
	"segment":              (*Config).unmarshalSegment,
	"sticky_store":         (*Config).unmarshalStore,
	"sticky_store_timeout": (*Config).unmarshalStoreTimeout,
}

// readField reads one option into its field. A string is free text unless
// the option has choices; a number is a count of at least 1; a duration
// must be positive, since in JSON zero means "default" and a Caddyfile zero
// is surely a mistake, except behind a pointer, where zero is a setting
// of its own; a bool is a flag, given without a value.
func readField(o *cfparse.Block, field any) error {
	var err error
	switch f := field.(type) {
	case *string:
		*f, err = o.String()
		if _, ok := choices[o.Name()]; ok && err == nil {
			if bad := checkChoice(o.Name(), *f); bad != nil {
				return o.Invalid(*f, bad)
			}
		}
	case *int:
		*f, err = o.Int(1, math.MaxInt)
	case *caddy.Duration:
		*f, err = o.Duration(time.Nanosecond)
	case **caddy.Duration:
		var v caddy.Duration
		v, err = o.Duration(0)
		*f = &v
	case **float64:
		*f, err = hysteresis(o)
	case *bool:
		err = o.Flag()
		*f = err == nil
	default:
		panic(fmt.Sprintf("latency_bucket: option %s has a field of type %T", o.Name(), field))
	}
	return err
}

// unmarshalStoreTimeout reads "sticky_store_timeout <duration>", which may
// come before "sticky_store".
func (c *Config) unmarshalStoreTimeout(o *cfparse.Block) error {
	d, err := o.Duration(time.Millisecond)
	if err != nil {
		return err
	}
	if c.StickyStore == nil {
		c.StickyStore = &StickyStore{}
	}
	c.StickyStore.Timeout = d
	return nil
}

// unmarshalChoices reads "choices <count>|all".
func (c *Config) unmarshalChoices(o *cfparse.Block) error {
	v, err := o.String()
	if err != nil {
		return err
	}
	if _, bad := choiceCount(v); bad != nil {
		return o.Invalid(v, bad)
	}
	c.Choices = v
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
