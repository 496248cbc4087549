package gatewaysel

import (
	"slices"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// DefaultHold is how long a location's first choice stays first: AnyConnect
// runs OGS again only on a connect at least 4 hours after a disconnect, and
// keeps its gateway across shorter reconnects.
const DefaultHold = 4 * time.Hour

// holdState is a location's held first choice.
type holdState struct {
	gw       string    // gateway name ("": none)
	until    time.Time // the hold ends then
	reported bool      // held on an order from client reports, not probes
}

// live reports whether h holds a gateway at now.
func (h holdState) live(now time.Time) bool { return h.gw != "" && now.Before(h.until) }

// hold applies location entry e's hold to res, an order about to be
// answered, and returns the order and when the hold ends. The rule: while
// the hold is live, its gateway stays first when res still has it measured
// (RTT > 0); the rest keep res's order. While the re-check finds it dead
// the hold is suspended (res as is, no hold). Otherwise (no hold, ended, or
// its gateway unmeasured in res) res's first
// choice is held from now for Config.Hold, when start (a fresh result, not
// a stand-in). A hold on the server's own probes does not hold an order
// from client reports (reported), nor the reverse: they measure from other
// places. Hold off (negative): res as is.
// Called with s.mu held.
func (s *Table) hold(e *entry, res *gatewayorder.Result, now time.Time, start, reported bool) (*gatewayorder.Result, time.Time) {
	if s.cfg.Hold <= 0 || res == nil || len(res.Order) == 0 {
		return res, time.Time{}
	}
	if e.hold.live(now) && e.hold.reported == reported {
		if _, dead := s.dead[e.hold.gw]; dead {
			// Suspended, not moved: while it is dead the order is the
			// re-check's, and a re-check that finds it back within the hold
			// puts it first again, as before it failed.
			return res, time.Time{}
		}
		if i := slices.IndexFunc(res.Gateways, func(g gatewayorder.Gateway) bool { return g.Name == e.hold.gw }); i >= 0 && res.RTTs[i] > 0 {
			if pos := slices.Index(res.Order, i); pos == 0 {
				return res, e.hold.until
			} else if pos > 0 {
				v := *res
				v.Order = append([]int{i}, slices.Delete(slices.Clone(res.Order), pos, pos+1)...)
				return &v, e.hold.until
			}
		}
	}
	if !start { // a stand-in answer (fallback) starts no hold
		return res, time.Time{}
	}
	e.hold = holdState{gw: res.Gateways[res.Order[0]].Name, until: now.Add(s.cfg.Hold), reported: reported}
	return res, e.hold.until
}

// carryHold marks res, a location's new result, with e's live hold, so that
// the store and the cache file keep it with the result. Called with s.mu held.
func (s *Table) carryHold(e *entry, res *gatewayorder.Result, now time.Time) {
	if res != nil && e.hold.live(now) && !e.hold.reported {
		res.Held, res.HoldUntil = e.hold.gw, e.hold.until
	}
}

// adoptHold takes the hold stored with res (another replica's result, which
// this replica answers from now on), once validated: none if it has none,
// so that every replica holds the stored result's first choice. Called with
// s.mu held.
func (s *Table) adoptHold(e *entry, res *gatewayorder.Result, now time.Time) {
	e.hold = s.validHold(res.Held, res.HoldUntil, now)
}

// conclude applies location entry e's hold to sel (hold.go) and notes its
// first choice as the location's last server. Called with s.mu held.
func (s *Table) conclude(e *entry, sel Selection, now time.Time) Selection {
	if sel.Source != Configured {
		sel.Result, sel.HoldUntil = s.hold(e, sel.Result, now, sel.Source.Fresh(), sel.Source == Reported)
	}
	sel.LastServer = e.last
	if sel.Result != nil && len(sel.Order) > 0 {
		e.last = sel.Gateways[sel.Order[0]].Name
	}
	return sel
}

// validHold returns the hold read from outside (the shared store, the cache
// file) when it names a configured gateway and ends within Config.Hold of
// now (plus a minute for clocks): like network input, it is checked before
// use. A hold already over, or invalid, is none.
func (s *Table) validHold(gw string, until time.Time, now time.Time) holdState {
	if _, ok := s.byName[gw]; !ok || s.cfg.Hold <= 0 || !now.Before(until) || until.After(now.Add(s.cfg.Hold+time.Minute)) {
		return holdState{}
	}
	return holdState{gw: gw, until: until}
}
