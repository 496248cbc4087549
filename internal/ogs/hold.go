package ogs

import (
	"slices"
	"time"
)

// DefaultHold is how long a location's first choice stays first: AnyConnect
// runs OGS again only on a connect at least 4 hours after a disconnect, and
// keeps its gateway across shorter reconnects.
const DefaultHold = 4 * time.Hour

// holdState is a location's held first choice.
type holdState struct {
	gw    string    // gateway name ("": none)
	until time.Time // the hold ends then
}

// live reports whether h holds a gateway at now.
func (h holdState) live(now time.Time) bool { return h.gw != "" && now.Before(h.until) }

// hold applies location entry e's hold to res, an order about to be
// answered, and returns the order and when the hold ends. The rule: while
// the hold is live, its gateway stays first when res still has it measured
// (RTT > 0) and the re-check has not found it dead; the rest keep res's
// order. Otherwise (no hold, ended, or its gateway failed) res's first
// choice is held from now for Config.Hold, when start (a fresh result, not
// a stand-in). Hold off (negative): res as is.
// Called with s.mu held.
func (s *Selector) hold(e *entry, res *Result, now time.Time, start bool) (*Result, time.Time) {
	if s.cfg.Hold <= 0 || res == nil || len(res.Order) == 0 {
		return res, time.Time{}
	}
	if e.hold.live(now) {
		if _, dead := s.dead[e.hold.gw]; !dead {
			if i := slices.IndexFunc(res.Gateways, func(g Gateway) bool { return g.Name == e.hold.gw }); i >= 0 && res.RTTs[i] > 0 {
				if pos := slices.Index(res.Order, i); pos == 0 {
					return res, e.hold.until
				} else if pos > 0 {
					v := *res
					v.Order = append([]int{i}, slices.Delete(slices.Clone(res.Order), pos, pos+1)...)
					return &v, e.hold.until
				}
			}
		}
	}
	if !start { // a stand-in answer (fallback) starts no hold
		return res, time.Time{}
	}
	e.hold = holdState{gw: res.Gateways[res.Order[0]].Name, until: now.Add(s.cfg.Hold)}
	return res, e.hold.until
}

// carryHold marks res, a location's new result, with e's live hold, so that
// the store and the cache file keep it with the result. Called with s.mu held.
func (s *Selector) carryHold(e *entry, res *Result, now time.Time) {
	if res != nil && e.hold.live(now) {
		res.Held, res.HoldUntil = e.hold.gw, e.hold.until
	}
}

// adoptHold takes the hold stored with res (another replica's result, which
// this replica answers from now on), once validated: none if it has none,
// so that every replica holds the stored result's first choice. Called with
// s.mu held.
func (s *Selector) adoptHold(e *entry, res *Result, now time.Time) {
	e.hold = s.validHold(res.Held, res.HoldUntil, now)
}

// validHold returns the hold read from outside (the shared store, the cache
// file) when it names a configured gateway and ends within Config.Hold of
// now (plus a minute for clocks): like network input, it is checked before
// use. A hold already over, or invalid, is none.
func (s *Selector) validHold(gw string, until time.Time, now time.Time) holdState {
	if _, ok := s.byName[gw]; !ok || s.cfg.Hold <= 0 || !now.Before(until) || until.After(now.Add(s.cfg.Hold+time.Minute)) {
		return holdState{}
	}
	return holdState{gw: gw, until: until}
}
