package pubsel

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

// Within is how a pick is made inside the lowest bucket.
type Within int

// The pick rules inside a bucket (`within random|least_conn|p2c`).
const (
	// WithinRandom picks a random available member (NPA's rule).
	WithinRandom Within = iota
	// WithinLeastConn picks the member the framework counts the fewest
	// connections or requests for (Host.Conns).
	WithinLeastConn
	// WithinP2C draws two distinct random members (Selector.Choices of
	// them, if more) and takes the one of lower Cost: the power of two
	// choices over latency × load.
	WithinP2C
)

// Flight is one request or connection in flight to a target, counted from
// Begin to Done. The zero Flight (an address not probed) counts nothing.
type Flight struct {
	tg *target
	k  int64 // in flight as it began, itself included
}

// Begin counts one more request or connection in flight to addr and
// returns its Flight. Like Observe it is the request path: one lookup in
// a copy-on-write index and one atomic add, no lock, no allocation.
func (t *Tracker) Begin(addr string) Flight {
	tg := (*t.byAddr.Load())[addr]
	if tg == nil {
		return Flight{}
	}
	return Flight{tg, tg.inFlight.Add(1)}
}

// Done ends the flight: call it exactly once, however the request ended.
func (f Flight) Done() {
	if f.tg != nil {
		f.tg.inFlight.Add(-1)
	}
}

// ObserveFlight records the latency of the request or connection of f as
// Observe does, without looking its target up again, and the requests in
// flight it began with (ObservedInFlight).
func (t *Tracker) ObserveFlight(f Flight, d time.Duration, failed bool) {
	if f.tg == nil {
		return
	}
	if failed {
		d = max(d, t.cfg.Load().FailureLatency)
	}
	f.tg.began.add(f.k)
	if c := f.tg.observed.Observe(d); int64(c) > 2*f.tg.estimate.Load() {
		f.tg.raise(c)
	}
}

// raise lifts tg's per-request figure at once to a confirmed answer c ÷
// the load its figure was measured at (ObservedInFlight) when that is
// more than twice the figure, until the next re-evaluation folds the
// answer into the average (at most 250 ms later). So a publisher that
// comes back to picks after its idle estimate decayed leaves them at its
// first confirmed slow answer, not a re-evaluation later with the picks
// that one would have given it (the traffic_tail benchmark's slow
// publisher, back every few half-lives). Judging each answer by the load
// it began with instead raised fast publishers that serve side by side
// at every answer begun alone, and let the slow one back in (traffic_tail
// 5.0×).
func (tg *target) raise(c time.Duration) {
	l := 1.0
	if st := tg.status.Load(); st != nil {
		l = max(st.ObservedInFlight, 1)
	}
	if p, e := int64(float64(c)/l), tg.estimate.Load(); p > 2*e {
		tg.estimate.CompareAndSwap(e, p)
	}
}

// Estimate is the latency a p2c pick expects of a publisher: the EWMA of
// its traffic (Observed) once any is counted (failures and timeouts in it
// as FailureLatency), else its probe latency. Never below 1 ns, so that
// requests in flight still tell two publishers apart while neither has a
// figure (cold start). Not the peak: a stall of the proxy's host lifts
// the peak of every publisher with traffic at once, and not an idle
// one's, which then looked cheaper for the peak's half-life (the
// traffic_tail benchmark: a publisher 10× slower got about 1 % of the
// requests with the peak, 0.01 % with the EWMA).
func Estimate(st *Status) time.Duration {
	if st == nil {
		return 1
	}
	e := st.ProbeLatency
	if st.ObservedSamples > 0 {
		e = st.Observed
	}
	return max(e, 1)
}

// PerRequest is a publisher's Estimate divided by the load it was
// measured at (ObservedInFlight): what each request in flight adds to the
// latency of one more. Never below 1 ns.
func PerRequest(st *Status) time.Duration {
	e := Estimate(st)
	if st == nil || st.ObservedSamples == 0 || st.ObservedInFlight <= 1 {
		return e
	}
	return max(time.Duration(float64(e)/st.ObservedInFlight), 1)
}

// Cost is what a p2c pick minimises: PerRequest × (requests in flight + 1),
// times LoadFactor of the publisher's own fresh load report with ORCA on.
// The +1 is the request being placed: an idle fast publisher costs its
// latency per request. A publisher that queues answers each request
// after those ahead of it, so its latency grows with its load and this
// is the latency the new request can expect; one that serves them side by
// side answers as fast at any load, and its latency, measured at its
// usual load, is not charged again once per request it serves.
func Cost(perRequest time.Duration, inFlight int64) time.Duration {
	return perRequest * time.Duration(max(inFlight, 0)+1)
}

// setStatus puts st in force for tg, with its PerRequest beside the
// requests in flight, where a pick reads both without following the
// status pointer.
func (tg *target) setStatus(st *Status) {
	tg.estimate.Store(int64(PerRequest(st)))
	tg.status.Store(st)
}

// cost of member m now in ns, before any load factor; an upstream that is
// not probed has no figures. An integer, so that the pick compares without
// a branch.
func (m *member[U]) cost() int64 {
	if m.tg == nil {
		return 1
	}
	return int64(Cost(time.Duration(m.tg.estimate.Load()), m.tg.inFlight.Load()))
}

// factors returns the load factors of a and b at now: each one's
// LoadFactor if its report is fresh; one without a fresh report (never
// reported, in blackout, expired, or not probed) takes the other's, so it
// is neither favoured nor shunned against it (A58 gives an endpoint
// without a weight the mean weight; against one other, that is the
// other's); neither fresh, both 1.
func factors(a, b *target, now int64, p orca.Periods) (fa, fb float64) {
	fa, oka := a.loadFactor(now, p)
	fb, okb := b.loadFactor(now, p)
	switch {
	case oka && !okb:
		fb = fa
	case okb && !oka:
		fa = fb
	}
	return fa, fb
}

// pickP2C draws two distinct random members of g (more: pickChoices, taken
// on one branch so that two stay as fast as ever) and takes the available
// one of lower cost (the first drawn on a tie). If neither is available it
// falls back to the first available member from a random start. The costs
// are compared first, so the common case asks the framework about one
// upstream's availability, not two.
func (s *Selector[U]) pickP2C(g []member[U], now int64) *member[U] {
	n := len(g)
	if n < 2 {
		return s.pickRandom(g)
	}
	if s.Choices > 2 {
		return s.pickChoices(g, now)
	}
	var i, j int
	if s.IntN != nil {
		i, j = s.twoFrom(n)
	} else {
		i, j = two(rand.Uint64(), n)
	}
	a, b := &g[i], &g[j]
	ca, cb := a.cost(), b.cost()
	if cfg := s.Tracker.cfg.Load(); cfg.ORCA && (a.reported() || b.reported()) {
		fa, fb := factors(a.tg, b.tg, now, cfg.ORCAPeriods)
		ca, cb = int64(float64(ca)*fa), int64(float64(cb)*fb)
	}
	if cb < ca {
		a, b = b, a
	}
	if s.Host.Available(a.u) {
		return a
	}
	if s.Host.Available(b.u) {
		return b
	}
	return s.pickRandom(g)
}

// ChoicesAll, as Selector.Choices, has within p2c compare every member
// of the lowest bucket.
const ChoicesAll = math.MaxInt

// pickChoices is pickP2C with Choices k > 2: it compares k distinct random
// members of g (every member if k ≥ len(g)) and takes the available one of
// lowest cost (on a tie, the first in g of those alike in having a
// fresh load report or not); none available, the first
// available member from a random start. The k are drawn into a bit set
// (Floyd) up to 64 members, else by selection sampling (each member in
// turn, taken with probability still needed / still left): neither holds
// a list of them. With ORCA on, a candidate
// without a fresh report takes the mean factor of those with one (A58's
// rule; factors is its case of two), so the fresh and the others are
// each kept to their own cheapest until that mean is known.
func (s *Selector[U]) pickChoices(g []member[U], now int64) *member[U] {
	n := len(g)
	need := min(s.Choices, n)
	cfg := s.Tracker.cfg.Load()
	var fresh, stale *member[U] // cheapest available with a fresh report, and without
	var freshCost float64
	var staleCost int64
	var sum float64
	var nFresh int
	// Up to 64 members, the k are drawn first by Floyd's algorithm (k
	// draws into a bit set); beyond, each member is drawn for in turn.
	var drawn uint64
	floyd := need < n && n <= 64
	for j := n - need; floyd && j < n; j++ {
		t := s.intN(j + 1)
		if drawn&(1<<t) != 0 {
			t = j
		}
		drawn |= 1 << t
	}
	for i := range g {
		if need == 0 {
			break
		}
		if floyd {
			if drawn&(1<<i) == 0 {
				continue
			}
		} else if need < n-i && s.intN(n-i) >= need {
			continue
		}
		need--
		m := &g[i]
		c := m.cost()
		f, ok := 1.0, false
		if cfg.ORCA {
			f, ok = m.tg.loadFactor(now, cfg.ORCAPeriods)
		}
		if ok {
			sum += f
			nFresh++
			if cf := float64(c) * f; (fresh == nil || cf < freshCost) && s.Host.Available(m.u) {
				fresh, freshCost = m, cf
			}
		} else if (stale == nil || c < staleCost) && s.Host.Available(m.u) {
			stale, staleCost = m, c
		}
	}
	switch {
	case fresh == nil && stale == nil:
		return s.pickRandom(g)
	case fresh == nil:
		return stale
	case stale == nil || freshCost < float64(staleCost)*sum/float64(nFresh):
		return fresh
	}
	return stale
}

// reported says whether m's backend ever sent a load report: until one
// does, a pick skips the ORCA factors altogether.
func (m *member[U]) reported() bool { return m.tg != nil && m.tg.reported.Load() }

// two turns one random word x into two distinct indices below n (n ≥ 2):
// a pick costs one call to the generator, as random's does. Each half of
// the word is scaled to its range by a multiply and a shift (Lemire), not
// a division; the bias, under n/2^32, is nothing next to the draw's own
// purpose.
func two(x uint64, n int) (i, j int) {
	i, j = int((x&0xffffffff)*uint64(n)>>32), int((x>>32)*uint64(n-1)>>32)
	if j >= i {
		j++
	}
	return i, j
}

// twoFrom is two with the test hook IntN.
func (s *Selector[U]) twoFrom(n int) (i, j int) {
	i, j = s.IntN(n), s.IntN(n-1)
	if j >= i {
		j++
	}
	return i, j
}
