package diameteragent

import (
	"math"
	"sync/atomic"
)

// group is a peer group of one generation; its counters and round-robin
// position (groupState) carry over to the next generation by name.
type group struct {
	GroupConfig
	members []*upstream
	st      *groupState
}

type groupState struct {
	rr                                            atomic.Uint32
	pending                                       atomic.Int64
	admitted, refused, busy, failedOver, timedOut atomic.Int64
	unavailable                                   atomic.Int64
}

// pick chooses a server for a request whose session is not bound (or
// whose bound server is not up): among the members that are OKAY and have
// room for another pending request, other than exclude, the next in turn
// (round_robin) or the one with the fewest pending requests, ties broken
// in turn (least_outstanding). full reports that some member was OKAY but
// had no room.
func (g *group) pick(exclude *upstream) (best *upstream, full bool) {
	n := uint32(len(g.members))
	start := g.st.rr.Add(1)
	bestN := int32(math.MaxInt32)
	for i := range n {
		u := g.members[(start+i)%n]
		if u == exclude {
			continue
		}
		l := u.current()
		if l == nil {
			continue
		}
		c := l.count.Load()
		if int(c) >= g.MaxPendingPerPeer {
			full = true
			continue
		}
		if g.Policy == RoundRobin {
			return u, full
		}
		if c < bestN {
			best, bestN = u, c
		}
	}
	return best, full
}

// member returns the member of id, or nil.
func (g *group) member(id uint32) *upstream {
	for _, u := range g.members {
		if u.id == id {
			return u
		}
	}
	return nil
}
