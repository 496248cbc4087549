package diameteragent

import (
	"math"

	"github.com/edgesteer/edgesteer/internal/doic"
)

// pickLoaded is the least_loaded policy: among the members OKAY with room
// (other than exclude), each gets new sessions in proportion to its
// headroom, 65 536 − its last RFC 8583 Load-Value; a member that reported
// no load yet counts at the mean of those that did (all at full headroom
// when none did). Turns are spread by the golden-ratio sequence over the
// cumulative weights, so the proportion holds over any run of requests
// without randomness. full reports that some member was OKAY but full.
func (g *group) pickLoaded(exclude *upstream) (best *upstream, full bool) {
	var buf [32]uint64
	w := buf[:0]
	if len(g.members) > len(buf) {
		w = make([]uint64, 0, len(g.members))
	}
	var sum, known, reported uint64
	for _, u := range g.members {
		var l uint64
		if u != exclude && u.current() != nil {
			if int(u.current().count.Load()) >= g.MaxPendingPerPeer {
				full = true
			} else if v := u.load.Load(); v > 0 {
				l, known, reported = uint64(v), known+uint64(v-1), reported+1
			} else {
				l = math.MaxUint64 // eligible, no report: filled in below
			}
		}
		w = append(w, l)
	}
	mean := uint64(0)
	if reported > 0 {
		mean = known / reported
	}
	for i, l := range w {
		switch l {
		case 0: // not eligible
		case math.MaxUint64:
			w[i] = doic.MaxLoadValue + 1 - mean
		default:
			w[i] = doic.MaxLoadValue + 1 - (l - 1)
		}
		sum += w[i]
	}
	if sum == 0 {
		return nil, full
	}
	n := g.st.rr.Add(1)
	_, frac := math.Modf(float64(n) * 0.6180339887498949)
	x := uint64(frac * float64(sum))
	for i, wi := range w {
		if x < wi {
			return g.members[i], full
		}
		x -= wi
	}
	for i := len(w) - 1; i >= 0; i-- { // rounding at the top end
		if w[i] > 0 {
			return g.members[i], full
		}
	}
	return nil, full
}
