package gatewaysel

import (
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/latency"
)

// DefaultRecheck is how often cached first choices are re-checked.
const DefaultRecheck = time.Minute

// Recheck is one re-check probe, as reported to Config.OnRecheck.
type Recheck struct {
	Gateway gatewayorder.Gateway
	RTT     time.Duration // 0: failed
	Err     error
	Reason  string
	Changed bool // the gateway was found dead, or alive again
}

// A cached result stands for its whole lifetime (14 days by default), so a
// gateway that dies meanwhile would stay first for every location that
// measured it best. The re-check keeps that cheap to notice: every Recheck
// interval, each gateway that is first in a fresh cached selection (as
// stored, or as answered) gets one probe from here, whatever the number of
// locations. A failed probe marks it dead; answers then move dead gateways
// behind every gateway not found dead (so behind its backups), keeping the
// order within each group, or leave them out with OmitUnmeasured — unless
// that would leave no gateway. A later successful re-check restores it.
// No probe run happens and the stored result is untouched: it still expires
// with its lifetime.
func (s *Table) recheck() {
	defer s.wg.Done()
	first := s.Config().Recheck
	if first <= 0 {
		first = time.Second
	}
	timer := time.NewTimer(first)
	defer timer.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
		}
		s.reconcile()
		cfg := s.Config()
		if cfg.Recheck <= 0 {
			timer.Reset(time.Second) // off: look again whether a reload turned it on (and reconcile)
			continue
		}
		s.recheckOnce(cfg)
		timer.Reset(cfg.Recheck)
	}
}

// RecheckNow runs one re-check at once (tests, and a caller's own timer).
func (s *Table) RecheckNow() { s.recheckOnce(s.Config()) }

func (s *Table) recheckOnce(cfg Config) {
	now := s.now()
	s.mu.Lock()
	firsts := map[string]bool{}
	for _, e := range s.entries {
		if e.hold.live(now) { // held first: a failed re-check releases it
			firsts[e.hold.gw] = true
		}
		if !s.fresh(e, now) || len(e.res.Order) == 0 {
			continue
		}
		firsts[e.res.Gateways[e.res.Order[0]].Name] = true
		if v := s.answered(e); len(v.Order) > 0 {
			firsts[v.Gateways[v.Order[0]].Name] = true
		}
	}
	for _, name := range s.reports.Firsts(now) {
		firsts[name] = true
	}
	var gws []gatewayorder.Gateway
	for name := range firsts {
		if i, ok := s.byName[name]; ok {
			gws = append(gws, s.cfg.Gateways[i])
		}
	}
	s.mu.Unlock()

	checks := make([]Recheck, len(gws))
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := latency.Measure(s.ctx, cfg.Prober, g.Addr, 1, cfg.ProbeTimeout)
			checks[i] = Recheck{Gateway: g, RTT: r.Best, Err: r.Err, Reason: Reason(r.Err)}
		}()
	}
	wg.Wait()
	if s.ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	for i, c := range checks {
		was, dead := s.dead[c.Gateway.Name]
		switch {
		case c.Err != nil && (!dead || was != c.Reason):
			s.dead[c.Gateway.Name] = c.Reason
			checks[i].Changed = !dead
			s.deadVer++
		case c.Err == nil && dead:
			delete(s.dead, c.Gateway.Name)
			checks[i].Changed = true
			s.deadVer++
		}
	}
	onRecheck := s.cfg.OnRecheck
	s.mu.Unlock()
	if onRecheck != nil {
		for _, c := range checks {
			onRecheck(c)
		}
	}
}

// answered returns e's result as answers give it: with gateways the
// re-check found dead moved back (or left out). It keeps the derived order
// until the result or the dead set changes. Called with s.mu held.
func (s *Table) answered(e *entry) *gatewayorder.Result {
	if e.res == nil || len(s.dead) == 0 {
		return e.res
	}
	if e.view != nil && e.viewOf == e.res && e.viewVer == s.deadVer {
		return e.view
	}
	e.view, e.viewOf, e.viewVer = s.demote(e.res), e.res, s.deadVer
	return e.view
}

// demote applies the dead set to res; called with s.mu held.
func (s *Table) demote(res *gatewayorder.Result) *gatewayorder.Result {
	var alive, dead []int
	var reasons []string
	for _, i := range res.Order {
		if why, ok := s.dead[res.Gateways[i].Name]; ok {
			dead = append(dead, i)
			if reasons == nil {
				reasons = make([]string, len(res.Gateways))
			}
			reasons[i] = why
		} else {
			alive = append(alive, i)
		}
	}
	if len(dead) == 0 || len(alive) == 0 {
		return res
	}
	v := *res
	v.Dead = reasons
	v.Order = alive
	if !s.cfg.OmitUnmeasured {
		v.Order = append(alive, dead...)
	}
	return &v
}
