package peerratelimit

import (
	"time"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

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
	registry.add(rt)
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
	registry.remove(rt)
	close(rt.done)
	if rt.dynamic != nil {
		rt.dynamic.stop()
	}
}
