package peerratelimit

import (
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// limiter is the configuration and run-time state that the HTTP and layer4
// handlers share (embedded, so its fields are theirs in JSON).
type limiter struct {
	// Name labels metrics and the admin API.
	Name     string          `json:"name,omitempty"`
	Profiles []ProfileConfig `json:"profiles"`
	Dynamic  *DynamicConfig  `json:"dynamic,omitempty"`

	runtime *runtime
}

// Cleanup stops dynamic throttling.
func (l *limiter) Cleanup() error {
	if l.runtime != nil {
		l.runtime.stop()
	}
	return nil
}

// unmarshalCaddyfile reads the handler block: name, profile (with
// message options from opt), dynamic, and what extra knows (it returns
// false for an option it does not know; nil: nothing more).
func (l *limiter) unmarshalCaddyfile(d *caddyfile.Dispenser, opt messageOption, extra func(*caddyfile.Dispenser) (bool, error)) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "name":
			if !d.Args(&l.Name) {
				return d.ArgErr()
			}
		case "profile":
			p, err := unmarshalProfile(d, opt)
			if err != nil {
				return err
			}
			l.Profiles = append(l.Profiles, p)
		case "dynamic":
			dc, err := unmarshalDynamic(d)
			if err != nil {
				return err
			}
			l.Dynamic = dc
		default:
			if extra != nil {
				if ok, err := extra(d); ok || err != nil {
					if err != nil {
						return err
					}
					continue
				}
			}
			return d.Errf("peer_rate_limit: unknown option %q", d.Val())
		}
	}
	return nil
}

// runtime is what the HTTP and layer4 handlers share while provisioned:
// the profiles' engines, dynamic throttling, the sweeper, and the admin
// registration.
type runtime struct {
	name    string
	kind    string
	engines []*ratelimit.Profile
	dynamic *dynamicRunner
	done    chan struct{}
}

func newRuntime(name, kind string, engines []*ratelimit.Profile, dc *DynamicConfig, dynamicRules []*ratelimit.Rule, logger *zap.Logger) (*runtime, error) {
	rt := &runtime{name: name, kind: kind, engines: engines, done: make(chan struct{})}
	if dc != nil {
		dr, err := dc.build(dynamicRules, logger, name)
		if err != nil {
			return nil, err
		}
		rt.dynamic = dr
		dr.start()
	}
	go rt.sweep()
	registry.Add(rt)
	return rt, nil
}

// sweep drops refilled buckets idle for a minute, so tables keyed by
// client-controlled peers shrink back after a flood.
func (rt *runtime) sweep() {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-rt.done:
			return
		case now := <-tick.C:
			for _, e := range rt.engines {
				e.Sweep(now.Add(-time.Minute).UnixNano(), now.UnixNano())
			}
		}
	}
}

func (rt *runtime) stop() {
	registry.Remove(rt)
	close(rt.done)
	if rt.dynamic != nil {
		rt.dynamic.stop()
	}
}
