package quota

import ()

type verdict int

const (
	fine       verdict = iota
	badValue           // a field that is not a count
	lostCounts         // a total below this replica's own counts
)

// share computes p's new fraction from the totals of epoch e−1; −1 keeps
// the current one. known: this replica's counts of e−1 are all in the
// store; returning: it wrote none there (it missed that sync), so the
// total is the others' demand alone. reserved of the n replicas are
// counted at their fallback share, limit ÷ n each (their demand is not
// in the total): the others divide what is left, limit × (n − reserved)
// ÷ n, by the same rules among n − reserved.
func (q *Quota) share(p *peer, raw Raw, e int64, n, reserved int, known, returning bool) (float64, verdict) {
	if _, ok := parseCount(raw.Admitted); !ok {
		return -1, badValue
	}
	total, ok := parseCount(raw.Demanded)
	if !ok {
		return -1, badValue
	}
	// The marked replicas that counted this peer in e−1 are at their
	// proportional share for it (their demand is in the total): no room
	// is left for them. This replica's own mark is not in reserved.
	marked, ok := parseCount(raw.Marked)
	if !ok {
		return -1, badValue
	}
	if p.markedAt == e-1 && marked > 0 {
		marked--
	}
	reserved = max(0, reserved-int(min(marked, uint64(n))))
	own := p.ownAt(e - 1)
	if total < own {
		return -1, lostCounts // the store lost or rewrote our counts
	}
	floor := q.floorFrac(n)
	perEpoch := q.effective() * q.cfg.Interval.Seconds()
	left, among := perEpoch*float64(n-reserved)/float64(n), float64(n-reserved)
	switch {
	case own > 0:
		if p.totE == 0 {
			p.ownE, p.totE = float64(own), float64(total)
		} else {
			p.ownE += smoothing * (float64(own) - p.ownE)
			p.totE += smoothing * (float64(total) - p.totE)
		}
		// Below what is left, each replica gets its demand and an equal
		// part of the rest; above, a part in proportion to its demand.
		// Either way the shares add up to what is left, and with the
		// reserved replicas' fallback shares to the limit.
		if spare := left - p.totE; spare > 0 {
			return max(floor, (p.ownE+spare/among)/perEpoch), fine
		}
		return max(floor, left/perEpoch*p.ownE/p.totE), fine
	case total == 0 && (known || returning):
		return 1 / float64(n), fine
	case returning:
		// The others' shares give each of them its demand and an equal
		// part of what is spare: this replica takes that part (none when
		// their demand fills the limit), not its share of before, which
		// the others have been admitting meanwhile.
		return max(floor, (left-float64(total))/among/perEpoch), fine
	case !known:
		return -1, fine
	default:
		return floor, fine
	}
}

// smoothing is the EWMA weight of the newest epoch's demand. 1 (no
// smoothing) so that a dead replica's share returns at the next epoch;
// the simulation measures what smoothing would trade (BENCHMARKS.md).
var smoothing = 1.0

// fallback gives every peer limit ÷ n; it returns the number of peers.
// A peer's trouble is kept: the store said nothing new of its keys, and
// they are asked again at the next sync.
func (q *Quota) fallback(n int, now int64) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.peers {
		p.frac = 1 / float64(n)
		q.apply(p, now)
	}
	q.overflow.frac = q.floorFrac(n)
	q.apply(q.overflow, now)
	return len(q.peers)
}
