package peerratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/loadsource"
	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// DynamicConfig is dynamic throttling: a load source sampled every
// interval, the threshold table, and the reversal rule. It throttles the
// message limits marked dynamic.
type DynamicConfig struct {
	// Source is "prometheus" (URL, Metric, Labels), "procstat" (this
	// host's CPU), "file" (Path holding a number) or, in HTTP handlers
	// and egress transports, "orca" (the cpu_utilization the backends
	// report in their answers' endpoint-load-metrics header).
	Source string            `json:"source"`
	URL    string            `json:"url,omitempty"`
	Metric string            `json:"metric,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Path   string            `json:"path,omitempty"`
	// Aggregate (orca): "max" (default) or "mean" of the backends' fresh
	// reports.
	Aggregate string `json:"aggregate,omitempty"`
	// ORCABlackout (orca): a backend's reports count once it has reported
	// without a break for this long (gRPC A58's blackout). Default 10s;
	// 0 counts them at once.
	ORCABlackout *caddy.Duration `json:"orca_blackout,omitempty"`
	// ORCAExpiration (orca): a report older than this no longer counts
	// (A58's expiration). Default 3m.
	ORCAExpiration caddy.Duration `json:"orca_expiration,omitempty"`
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

// dynamicSettings is how one generation samples its load: the source and
// the interval, and the logger to report to.
type dynamicSettings struct {
	src    loadsource.Source
	every  time.Duration
	logger *zap.Logger
	orca   *orcaFeed // source orca: the answers' reports

	orcaReleased bool // provisioning and Cleanup only

	mu      sync.Mutex
	lastErr string
}

// Build validates the config, naming the option and value after prefix,
// and returns the load source and the controller (the engine's, holding
// the table and the reversal rule). The diameter_agent's egress groups
// share it.
func (c *DynamicConfig) Build(prefix string) (loadsource.Source, *ratelimit.Dynamic, error) {
	return c.buildWith(prefix, nil)
}

// buildWith is Build where the answers' ORCA reports pass through feed
// (nil: none do, and source orca is refused).
func (c *DynamicConfig) buildWith(prefix string, feed *orcaFeed) (loadsource.Source, *ratelimit.Dynamic, error) {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("%sdynamic %s %v: %s", prefix, opt, v, why)
	}
	src, err := c.orcaSource(prefix, feed)
	if err != nil {
		return nil, nil, err
	}
	switch c.Source {
	case "orca": // orcaSource made it
	case "prometheus":
		p, err := loadsource.NewPrometheus(c.URL, c.Metric, c.Labels)
		if err != nil {
			return nil, nil, bad("source", "prometheus", err.Error())
		}
		src = p
	case "procstat":
		src = &loadsource.ProcStat{}
	case "file":
		if c.Path == "" {
			return nil, nil, bad("path", `""`, "the file source needs a path")
		}
		src = &loadsource.File{Path: c.Path}
	default:
		return nil, nil, bad("source", strconv.Quote(c.Source), "want prometheus, procstat, file or orca")
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
		return nil, nil, fmt.Errorf("%sdynamic: %v", prefix, err)
	}
	if c.Interval < 0 {
		return nil, nil, bad("interval", time.Duration(c.Interval), "must be positive")
	}
	return src, ctl, nil
}

// build validates the config and returns the sampling settings and the
// controller.
func (c *DynamicConfig) build(rules []*ratelimit.Rule, logger *zap.Logger, feed *orcaFeed) (*dynamicSettings, *ratelimit.Dynamic, error) {
	src, ctl, err := c.buildWith("peer_rate_limit: ", feed)
	if err != nil {
		return nil, nil, err
	}
	every := time.Duration(c.Interval)
	if every == 0 {
		every = 5 * time.Second
	}
	if len(rules) == 0 {
		return nil, nil, fmt.Errorf("peer_rate_limit: dynamic is configured but no limit is marked dynamic: mark a message limit (dynamic in its message block) or a profile's overall rate (dynamic in the profile)")
	}
	return &dynamicSettings{src: src, every: every, logger: logger, orca: feed}, ctl, nil
}

// sampleLoop samples the load with the settings of the generation in
// force (the newest with dynamic throttling: a reload's new source and
// interval apply from the next sample) and feeds the store's controller.
// The schedule runs on across reloads, so a reversal hold in progress
// is neither restarted nor cut short.
func (hs *handlerState) sampleLoop() {
	defer hs.wg.Done()
	var tick *time.Ticker
	for {
		every := time.Second // while no generation has dynamic throttling
		if g, _ := hs.store.Active().(*generation); g != nil && g.dynamic != nil {
			hs.sample(g.dynamic, monoclock.Now())
			every = g.dynamic.every
		}
		if tick == nil {
			tick = time.NewTicker(every)
			defer tick.Stop()
		} else {
			tick.Reset(every)
		}
		select {
		case <-hs.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sample reads the load once; when the source cannot be read the throttle
// stays where it was.
func (hs *handlerState) sample(ds *dynamicSettings, now time.Time) {
	rctx, cancel := context.WithTimeout(hs.ctx, ds.every)
	load, err := ds.src.Read(rctx)
	cancel()
	if hs.ctx.Err() != nil {
		return
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if err != nil {
		theMetrics.sourceErrors.WithLabelValues(hs.name).Inc()
		if err.Error() != ds.lastErr {
			st, _ := hs.store.Controller()
			ds.logger.Warn("load source unreadable: keeping the last throttle level",
				zap.String("source", ds.src.String()), zap.Int("throttle_percent", st.Throttle), zap.Error(err))
		}
		ds.lastErr = err.Error()
		return
	}
	ds.lastErr = ""
	before, pct, ok := hs.store.Sample(load, now)
	if !ok {
		return
	}
	hs.applyClusterThrottle()
	theMetrics.load.WithLabelValues(hs.name).Set(load)
	theMetrics.throttle.WithLabelValues(hs.name).Set(float64(pct))
	if pct != before {
		ds.logger.Info("dynamic throttle changed", zap.Float64("load_percent", load),
			zap.Int("from_percent", before), zap.Int("to_percent", pct))
	}
}

// lastError returns the last read error of the settings' source, or "".
func (ds *dynamicSettings) lastError() string {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.lastErr
}

// UnmarshalDynamic reads, at a "dynamic" option with a block,
//
//	dynamic {
//		source prometheus <url> <metric> [<label>=<value>...] | procstat | file <path> | orca [max|mean]
//		orca_blackout <duration>
//		orca_expiration <duration>
//		interval <duration>
//		threshold <load %> <throttle %>     # may repeat, rising
//		reversal <load %>
//		reversal_hold <duration>
//		reversal_step <points>
//	}
//
// threshold may repeat (the rows of the table); every other option, and
// the dynamic block itself, is given once.
func UnmarshalDynamic(o *cfparse.Block) (*DynamicConfig, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	if _, err := o.BlockArgs(0, 0); err != nil {
		return nil, err
	}
	c := &DynamicConfig{}
	for sub := o.Sub(); sub.Next(); {
		var err error
		switch sub.Name() {
		case "source":
			err = c.unmarshalSource(sub)
		case "interval":
			c.Interval, err = sub.Duration(time.Nanosecond)
		case "reversal_hold":
			c.ReversalHold, err = sub.Duration(time.Nanosecond)
		case "orca_blackout":
			var d caddy.Duration
			if d, err = sub.Duration(0); err == nil {
				c.ORCABlackout = &d
			}
		case "orca_expiration":
			c.ORCAExpiration, err = sub.Duration(time.Nanosecond)
		case "threshold":
			var args []string
			if args, err = sub.Args(2, 2); err == nil {
				var th Threshold
				if th.Load, err = sub.ParseFloat(args[0], 0, 100); err == nil {
					if th.Throttle, err = cfparse.Int(args[1], 0, 100); err != nil {
						err = sub.Errf("%s: throttle %q: %v", args[0], args[1], err)
					}
				}
				c.Thresholds = append(c.Thresholds, th)
			}
		case "reversal":
			var v float64
			if v, err = sub.Float(0, 100); err == nil {
				c.Reversal = &v
			}
		case "reversal_step":
			c.ReversalStep, err = sub.Int(1, 100)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// unmarshalSource reads "source prometheus <url> <metric> [<label>=<value>...]
// | procstat | file <path> | orca [max|mean]".
func (c *DynamicConfig) unmarshalSource(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(1, cfparse.Many)
	if err != nil {
		return err
	}
	c.Source = args[0]
	switch {
	case args[0] == "prometheus" && len(args) >= 3:
		c.URL, c.Metric = args[1], args[2]
		for _, kv := range args[3:] {
			k, v, ok := cut(kv)
			if !ok {
				return o.Errf("label %q: want name=value", kv)
			}
			if _, dup := c.Labels[k]; dup {
				return o.Errf("label %s given twice", k)
			}
			if c.Labels == nil {
				c.Labels = map[string]string{}
			}
			c.Labels[k] = v
		}
	case args[0] == "procstat" && len(args) == 1:
	case args[0] == "file" && len(args) == 2:
		c.Path = args[1]
	case args[0] == "orca" && len(args) <= 2:
		if len(args) == 2 {
			c.Aggregate = args[1]
		}
	default:
		return o.Invalid(strings.Join(args, " "), errors.New("want prometheus <url> <metric> [label=value...], procstat, file <path>, or orca [max|mean]"))
	}
	return nil
}

func cut(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], i > 0
		}
	}
	return "", "", false
}
