package diameteragent

import (
	"context"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/loadsource"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// Dynamic throttles a group's egress limit by a load figure, as
// peer_rate_limit's dynamic throttling does and with its engine: the
// Source (internal/loadsource) is read every Interval and the Controller
// (internal/ratelimit's threshold table and reversal rule) turns the load
// into the percent of every egress rate of the group withheld.
type Dynamic struct {
	Source     loadsource.Source
	Interval   time.Duration // default 5 s
	Controller *ratelimit.Dynamic
}

// throttler samples one group's load across generations: a reload's new
// source, interval and table apply from the next sample, and the level and
// a reversal hold in progress carry over (ratelimit.Dynamic.Continue).
type throttler struct {
	a    *Agent
	name string // the group's

	mu      sync.Mutex
	ctl     *ratelimit.Dynamic // the controller in force
	lastErr string
	errors  int64
}

// DynamicView is a group's dynamic throttling for the admin view.
type DynamicView struct {
	Source          string    `json:"source"`
	LoadPercent     float64   `json:"load_percent"`
	SampledAt       time.Time `json:"sampled_at,omitzero"`
	ThrottlePercent int       `json:"throttle_percent"`
	LastError       string    `json:"last_error,omitempty"`
	Errors          int64     `json:"errors"` // failed reads: the level stayed
}

// installDynamic (a.mu held) hands each group's controller the level of
// the one before it and applies that level to the group's egress rules
// (a changed limit starts throttled as the group is); a group without
// dynamic throttling is not throttled. Started agents sample new groups.
func (a *Agent) installDynamic(g *generation) {
	for name, gr := range g.groups {
		if gr.Dynamic == nil {
			if gr.Egress != nil {
				setThrottle(gr.Egress, 0)
			}
			a.reportThrottle(gr, &g.cfg, 0)
			continue
		}
		t := a.throttlers[name]
		if t == nil {
			t = &throttler{a: a, name: name, ctl: gr.Dynamic.Controller}
			a.throttlers[name] = t
			if a.started {
				t.schedule(g)
			}
		}
		t.mu.Lock()
		if t.ctl != gr.Dynamic.Controller {
			gr.Dynamic.Controller.Continue(t.ctl)
			t.ctl = gr.Dynamic.Controller
		}
		if gr.Egress != nil {
			setThrottle(gr.Egress, t.ctl.Throttle())
		}
		a.reportThrottle(gr, &g.cfg, t.ctl.Throttle())
		t.mu.Unlock()
	}
}

func setThrottle(p *ratelimit.Profile, pct int) {
	for _, r := range p.Rules() {
		r.SetThrottle(pct)
	}
}

// schedule samples after the interval of generation g's group (a second
// if it has none: the next sample ends the throttler).
func (t *throttler) schedule(g *generation) {
	every := time.Second
	if gr := g.groups[t.name]; gr != nil && gr.Dynamic != nil {
		every = gr.Dynamic.Interval
	}
	t.a.clock.AfterFunc(every, t.sample)
}

// sample reads the load once with the configuration in force and sets
// the group's throttle; an unreadable source leaves the level as it was.
// A group gone, or without dynamic throttling now, stops its sampling
// (and its limits are no longer throttled).
func (t *throttler) sample() {
	a := t.a
	g := a.gen.Load()
	gr := g.groups[t.name]
	a.mu.Lock()
	if a.closed || gr == nil || gr.Dynamic == nil || a.throttlers[t.name] != t {
		if a.throttlers[t.name] == t {
			delete(a.throttlers, t.name)
		}
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	d := gr.Dynamic
	ctx, cancel := context.WithTimeout(context.Background(), d.Interval)
	load, err := d.Source.Read(ctx)
	cancel()
	t.mu.Lock()
	if err != nil {
		t.errors++
		if err.Error() != t.lastErr {
			a.log.Warn("load source unreadable: keeping the group's throttle level", "group", t.name,
				"source", d.Source.String(), "throttle_percent", t.ctl.Throttle(), "error", err)
		}
		t.lastErr = err.Error()
	} else if t.ctl == d.Controller { // else a reload is installing its own
		t.lastErr = ""
		before := t.ctl.Throttle()
		pct := t.ctl.Sample(load, a.clock.Now())
		if gr.Egress != nil {
			setThrottle(gr.Egress, pct)
		}
		gr.st.dynLoad.Store(int64(load * 100))
		a.reportThrottle(gr, &g.cfg, pct)
		if pct != before {
			a.log.Info("group throttle changed", "group", t.name, "load_percent", load, "from_percent", before, "to_percent", pct)
		}
	}
	t.mu.Unlock()
	t.schedule(a.gen.Load())
}

// view reports the throttler's state.
func (t *throttler) view(src loadsource.Source) *DynamicView {
	t.mu.Lock()
	defer t.mu.Unlock()
	load, at := t.ctl.Last()
	return &DynamicView{Source: src.String(), LoadPercent: load, SampledAt: at, ThrottlePercent: t.ctl.Throttle(),
		LastError: t.lastErr, Errors: t.errors}
}
