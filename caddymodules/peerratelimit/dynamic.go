package peerratelimit

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/loadsource"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// DynamicConfig is dynamic throttling: a load source sampled every
// interval, the threshold table, and the reversal rule. It throttles the
// message limits marked dynamic.
type DynamicConfig struct {
	// Source is "prometheus" (URL, Metric, Labels), "procstat" (this
	// host's CPU) or "file" (Path holding a number).
	Source string            `json:"source"`
	URL    string            `json:"url,omitempty"`
	Metric string            `json:"metric,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Path   string            `json:"path,omitempty"`
	// Interval between samples (default 5s).
	Interval caddy.Duration `json:"interval,omitempty"`
	// Thresholds: at a load of at least Load percent, withhold Throttle
	// percent. Rising loads, non-falling throttles.
	Thresholds []Threshold `json:"thresholds"`
	// Reversal: below this load for ReversalHold (default 30s), the
	// throttle drops by ReversalStep points (default 20). Default: the
	// lowest threshold.
	Reversal     *float64       `json:"reversal,omitempty"`
	ReversalHold caddy.Duration `json:"reversal_hold,omitempty"`
	ReversalStep int            `json:"reversal_step,omitempty"`
}

// Threshold is one row of the table.
type Threshold struct {
	Load     float64 `json:"load"`
	Throttle int     `json:"throttle"`
}

// dynamicRunner samples the source and applies the controller's throttle
// to its rules.
type dynamicRunner struct {
	src    loadsource.Source
	ctl    *ratelimit.Dynamic
	rules  []*ratelimit.Rule
	every  time.Duration
	logger *zap.Logger
	name   string

	mu       sync.Mutex
	lastErr  string
	lastRead time.Time
	cancel   context.CancelFunc
	done     chan struct{}
}

func (c *DynamicConfig) build(rules []*ratelimit.Rule, logger *zap.Logger, name string) (*dynamicRunner, error) {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("peer_rate_limit: dynamic %s %v: %s", opt, v, why)
	}
	var src loadsource.Source
	switch c.Source {
	case "prometheus":
		p, err := loadsource.NewPrometheus(c.URL, c.Metric, c.Labels)
		if err != nil {
			return nil, fmt.Errorf("peer_rate_limit: dynamic source prometheus: %v", err)
		}
		src = p
	case "procstat":
		src = &loadsource.ProcStat{}
	case "file":
		if c.Path == "" {
			return nil, bad("path", `""`, "the file source needs a path")
		}
		src = &loadsource.File{Path: c.Path}
	default:
		return nil, bad("source", strconv.Quote(c.Source), "want prometheus, procstat or file")
	}
	table := make([]ratelimit.Step, len(c.Thresholds))
	for i, t := range c.Thresholds {
		table[i] = ratelimit.Step{AtLeast: t.Load, Throttle: t.Throttle}
	}
	reversal := 0.0
	if len(table) > 0 {
		reversal = table[0].AtLeast
	}
	if c.Reversal != nil {
		reversal = *c.Reversal
	}
	hold, step := time.Duration(c.ReversalHold), c.ReversalStep
	if hold == 0 {
		hold = ratelimit.DefaultReversalHold
	}
	if step == 0 {
		step = ratelimit.DefaultReversalStep
	}
	ctl, err := ratelimit.NewDynamic(table, reversal, hold, step)
	if err != nil {
		return nil, fmt.Errorf("peer_rate_limit: dynamic: %v", err)
	}
	if c.Interval < 0 {
		return nil, bad("interval", time.Duration(c.Interval), "must be positive")
	}
	every := time.Duration(c.Interval)
	if every == 0 {
		every = 5 * time.Second
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("peer_rate_limit: dynamic is configured but no message limit is marked dynamic")
	}
	return &dynamicRunner{src: src, ctl: ctl, rules: rules, every: every, logger: logger, name: name}, nil
}

func (r *dynamicRunner) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		tick := time.NewTicker(r.every)
		defer tick.Stop()
		for {
			r.sample(ctx, time.Now())
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

func (r *dynamicRunner) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
}

// sample reads the load once; when the source cannot be read the throttle
// stays where it was.
func (r *dynamicRunner) sample(ctx context.Context, now time.Time) {
	rctx, cancel := context.WithTimeout(ctx, r.every)
	load, err := r.src.Read(rctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		theMetrics.sourceErrors.WithLabelValues(r.name).Inc()
		if err.Error() != r.lastErr {
			r.logger.Warn("load source unreadable: keeping the last throttle level",
				zap.String("source", r.src.String()), zap.Int("throttle_percent", r.ctl.Throttle()), zap.Error(err))
		}
		r.lastErr = err.Error()
		return
	}
	r.lastErr, r.lastRead = "", now
	before := r.ctl.Throttle()
	pct := r.ctl.Sample(load, now)
	for _, rule := range r.rules {
		rule.SetThrottle(pct)
	}
	theMetrics.load.WithLabelValues(r.name).Set(load)
	theMetrics.throttle.WithLabelValues(r.name).Set(float64(pct))
	if pct != before {
		r.logger.Info("dynamic throttle changed", zap.Float64("load_percent", load),
			zap.Int("from_percent", before), zap.Int("to_percent", pct))
	}
}

// state returns the controller's view, for the admin API.
func (r *dynamicRunner) state() (load float64, at time.Time, throttle int, lastErr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	load, at = r.ctl.Last()
	return load, at, r.ctl.Throttle(), r.lastErr
}

// unmarshalDynamic reads
//
//	dynamic {
//		source prometheus <url> <metric> [<label>=<value>...] | procstat | file <path>
//		interval <duration>
//		threshold <load %> <throttle %>     # repeat, rising
//		reversal <load %>
//		reversal_hold <duration>
//		reversal_step <points>
//	}
func unmarshalDynamic(d *caddyfile.Dispenser) (*DynamicConfig, error) {
	c := &DynamicConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		args := d.RemainingArgs()
		num := func(s string) (float64, error) {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, d.Errf("peer_rate_limit: dynamic %s %q: not a number", opt, s)
			}
			return v, nil
		}
		switch opt {
		case "source":
			if len(args) == 0 {
				return nil, d.ArgErr()
			}
			c.Source = args[0]
			switch {
			case args[0] == "prometheus" && len(args) >= 3:
				c.URL, c.Metric = args[1], args[2]
				for _, kv := range args[3:] {
					k, v, ok := cut(kv)
					if !ok {
						return nil, d.Errf("peer_rate_limit: dynamic source label %q: want name=value", kv)
					}
					if c.Labels == nil {
						c.Labels = map[string]string{}
					}
					c.Labels[k] = v
				}
			case args[0] == "procstat" && len(args) == 1:
			case args[0] == "file" && len(args) == 2:
				c.Path = args[1]
			default:
				return nil, d.Errf("peer_rate_limit: dynamic source %q: want prometheus <url> <metric> [label=value...], procstat, or file <path>", args)
			}
		case "interval", "reversal_hold":
			if len(args) != 1 {
				return nil, d.ArgErr()
			}
			v, err := caddy.ParseDuration(args[0])
			if err != nil || v <= 0 {
				return nil, d.Errf("peer_rate_limit: dynamic %s %q: want a positive duration", opt, args[0])
			}
			if opt == "interval" {
				c.Interval = caddy.Duration(v)
			} else {
				c.ReversalHold = caddy.Duration(v)
			}
		case "threshold":
			if len(args) != 2 {
				return nil, d.ArgErr()
			}
			l, err := num(args[0])
			if err != nil {
				return nil, err
			}
			t, err := strconv.Atoi(args[1])
			if err != nil {
				return nil, d.Errf("peer_rate_limit: dynamic threshold %s %q: the throttle must be a whole percent", args[0], args[1])
			}
			c.Thresholds = append(c.Thresholds, Threshold{Load: l, Throttle: t})
		case "reversal":
			if len(args) != 1 {
				return nil, d.ArgErr()
			}
			v, err := num(args[0])
			if err != nil {
				return nil, err
			}
			c.Reversal = &v
		case "reversal_step":
			if len(args) != 1 {
				return nil, d.ArgErr()
			}
			v, err := strconv.Atoi(args[0])
			if err != nil {
				return nil, d.Errf("peer_rate_limit: dynamic reversal_step %q: want whole percent points", args[0])
			}
			c.ReversalStep = v
		default:
			return nil, d.Errf("peer_rate_limit: dynamic: unknown option %q", opt)
		}
	}
	return c, nil
}

func cut(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], i > 0
		}
	}
	return "", "", false
}
