package gatewaysel

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// Change says what Reconfigure did to the cached results.
type Change struct {
	Added, Removed, Readdressed []string // gateway names
	ProbeChanged                bool
	Expired                     int // results made stale: kept only as the previous selection
	Dropped                     int // results left with no measured gateway
	Evicted                     int // locations beyond a lowered max_locations
}

// Invalidates reports whether the change made cached measurements stale.
func (c Change) Invalidates() bool {
	return len(c.Added) > 0 || len(c.Readdressed) > 0 || c.ProbeChanged
}

func (c Change) String() string {
	var parts []string
	add := func(what string, names []string) {
		if len(names) > 0 {
			parts = append(parts, what+" "+strings.Join(names, ","))
		}
	}
	add("added", c.Added)
	add("removed", c.Removed)
	add("readdressed", c.Readdressed)
	if c.ProbeChanged {
		parts = append(parts, "probe changed")
	}
	if c.Expired > 0 {
		parts = append(parts, fmt.Sprintf("%d location(s) to probe again", c.Expired))
	}
	if c.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d location(s) left without a result", c.Dropped))
	}
	if c.Evicted > 0 {
		parts = append(parts, fmt.Sprintf("%d location(s) evicted", c.Evicted))
	}
	if len(parts) == 0 {
		return "cached results kept"
	}
	return strings.Join(parts, "; ")
}

// Reconfigure applies a new configuration to the running selector, keeping
// what stays true of its cached results:
//
//   - A removed gateway leaves every cached order; the other gateways' RTTs
//     stand, so those results stay fresh. A result whose only measured
//     gateways were removed is dropped.
//   - An added gateway, a gateway whose address changed, or a changed probe
//     (ProbeID) makes every cached result stale: its location probes again
//     on its next query, and meanwhile the stale result is its previous
//     selection (the deadline fallback), mapped onto the new gateways.
//   - Changed backup lists or OmitUnmeasured reorder the cached results from
//     their stored RTTs; a changed CacheTTL applies to each result's age.
//   - Probe runs in flight finish and are mapped the same way; Deadline,
//     ProbeTimeout, Retry and Probes apply from the next run; AnswerDeadline
//     from the next query.
//   - A lowered MaxLocations evicts the least recently used locations.
//   - A new CacheFile is written with the results held; it is not read.
func (s *Table) Reconfigure(cfg Config) (Change, error) {
	if err := cfg.Validate(); err != nil {
		return Change{}, err
	}
	cfg.FillDefaults()
	var ch Change
	s.mu.Lock()
	old := s.cfg
	oldIdx := s.byName
	for _, g := range cfg.Gateways {
		i, ok := oldIdx[g.Name]
		switch {
		case !ok:
			ch.Added = append(ch.Added, g.Name)
		case old.Gateways[i].Addr != g.Addr:
			ch.Readdressed = append(ch.Readdressed, g.Name)
		}
	}
	s.setConfig(cfg)
	for _, g := range old.Gateways {
		if _, ok := s.byName[g.Name]; !ok {
			ch.Removed = append(ch.Removed, g.Name)
		}
	}
	ch.ProbeChanged = old.ProbeID != cfg.ProbeID
	for _, name := range append(ch.Removed, ch.Readdressed...) {
		if _, ok := s.dead[name]; ok {
			delete(s.dead, name)
			s.deadVer++
		}
	}
	if ch.Invalidates() {
		s.epoch++
	}
	reorder := !sameGateways(old.Gateways, cfg.Gateways) || old.OmitUnmeasured != cfg.OmitUnmeasured
	for _, e := range s.entries {
		if ch.Invalidates() { // the hold rests on measurements no longer comparable
			e.hold = holdState{}
		}
		if e.res == nil {
			continue
		}
		if reorder {
			if e.res = s.remap(e.res); e.res == nil {
				ch.Dropped++
				continue
			}
		}
		if ch.Invalidates() && e.epoch == s.epoch-1 {
			ch.Expired++
		}
	}
	before := len(s.entries)
	s.evictTo(cfg.MaxLocations)
	ch.Evicted = before - len(s.entries)
	s.mu.Unlock()
	if cfg.CacheFile != old.CacheFile && cfg.CacheFile != "" {
		s.requestSave()
	}
	return ch, nil
}

// remap maps res onto the configuration in force, by gateway name: RTTs of
// gateways kept (at the same address) carry over, others count as not
// measured. It returns nil when no measured gateway remains. Called with
// s.mu held.
func (s *Table) remap(res *gatewayorder.Result) *gatewayorder.Result {
	was := make(map[string]int, len(res.Gateways))
	for i, g := range res.Gateways {
		was[g.Name] = i
	}
	gws := s.cfg.Gateways
	rtts := make([]time.Duration, len(gws))
	var reasons []string
	any := false
	for i, g := range gws {
		j, ok := was[g.Name]
		if !ok || res.Gateways[j].Addr != g.Addr {
			continue
		}
		if res.RTTs[j] > 0 {
			rtts[i] = res.RTTs[j]
			any = true
		}
		if res.Reasons != nil {
			if reasons == nil {
				reasons = make([]string, len(gws))
			}
			reasons[i] = res.Reasons[j]
		}
	}
	if !any {
		return nil
	}
	return &gatewayorder.Result{Gateways: gws, Order: gatewayorder.Order(gws, rtts, s.cfg.OmitUnmeasured), RTTs: rtts, Reasons: reasons, At: res.At}
}

// sameGateways reports whether a and b list the same gateways, addresses and
// backups in the same order.
func sameGateways(a, b []gatewayorder.Gateway) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) > 0 && &a[0] == &b[0] {
		return true
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Addr != b[i].Addr || !slices.Equal(a[i].Backups, b[i].Backups) ||
			!slices.EqualFunc(a[i].Unprobed, b[i].Unprobed, func(x, y gatewayorder.Gateway) bool { return x.Name == y.Name && x.Addr == y.Addr }) {
			return false
		}
	}
	return true
}
