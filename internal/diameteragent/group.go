package diameteragent

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
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
	report                                        atomic.Pointer[groupReport] // DOIC: what the agent reports
	dynLoad                                       atomic.Int64                // last load read, percent × 100
}

// pick chooses a server for a request whose session is not bound (or
// whose bound server is not up): among the members that are OKAY and have
// room for another pending request, other than exclude, the next in turn
// (round_robin) or the one with the fewest pending requests, ties broken
// in turn (least_outstanding), or the one in the lowest latency bucket of
// its answer latency, ties in turn (latency_bucket: internal/latency's
// buckets of the group's width; a server not answered yet counts as in
// the lowest, so it is tried and measured). full reports that some member
// was OKAY but had no room.
func (g *group) pick(exclude *upstream) (best *upstream, full bool) {
	if g.Policy == LeastLoaded {
		return g.pickLoaded(exclude)
	}
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
		switch g.Policy {
		case RoundRobin:
			return u, full
		case LatencyBucket:
			c = int32(latency.Bucket(time.Duration(u.latency.Load()), g.BucketWidth))
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
