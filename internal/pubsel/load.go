package pubsel

import (
	"math/rand/v2"
	"time"
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
	// WithinP2C draws two distinct random members and takes the one of
	// lower Cost: the power of two choices over latency × load.
	WithinP2C
)

// Flight is one request or connection in flight to a target, counted from
// Begin to Done. The zero Flight (an address not probed) counts nothing.
type Flight struct{ tg *target }

// Begin counts one more request or connection in flight to addr and
// returns its Flight. Like Observe it is the request path: one lookup in
// a copy-on-write index and one atomic add, no lock, no allocation.
func (t *Tracker) Begin(addr string) Flight {
	tg := (*t.byAddr.Load())[addr]
	if tg != nil {
		tg.inFlight.Add(1)
	}
	return Flight{tg}
}

// Done ends the flight: call it exactly once, however the request ended.
func (f Flight) Done() {
	if f.tg != nil {
		f.tg.inFlight.Add(-1)
	}
}

// ObserveFlight records the latency of the request or connection of f as
// Observe does, without looking its target up again.
func (t *Tracker) ObserveFlight(f Flight, d time.Duration, failed bool) {
	if f.tg == nil {
		return
	}
	if failed {
		d = max(d, t.cfg.Load().FailureLatency)
	}
	f.tg.observed.Observe(d)
}

// Estimate is the latency a p2c pick expects of a publisher: the peak-EWMA
// of its traffic once any is counted (failures and timeouts in it as
// FailureLatency), else its probe latency. Never below 1 ns, so that
// requests in flight still tell two publishers apart while neither has a
// figure (cold start).
func Estimate(st *Status) time.Duration {
	if st == nil {
		return 1
	}
	e := st.ProbeLatency
	if st.ObservedSamples > 0 {
		e = st.ObservedPeak
	}
	return max(e, 1)
}

// Cost is what a p2c pick minimises: estimate × (requests in flight + 1).
// The +1 is the request being placed: an idle fast publisher costs its
// latency, and a busy one its latency once per request ahead of it.
func Cost(estimate time.Duration, inFlight int64) time.Duration {
	return estimate * time.Duration(max(inFlight, 0)+1)
}

// Load returns target id's requests in flight, latency estimate and cost
// as a p2c pick would see them now (for the admin view).
func (t *Tracker) Load(id uint32) (inFlight int64, estimate, cost time.Duration) {
	byID := *t.byID.Load()
	if int(id) >= len(byID) || byID[id] == nil {
		return 0, 0, 0
	}
	tg := byID[id]
	inFlight = max(tg.inFlight.Load(), 0)
	estimate = Estimate(tg.status.Load())
	return inFlight, estimate, Cost(estimate, inFlight)
}

// cost of member m now; an upstream that is not probed has no figures.
func (m *member[U]) cost() time.Duration {
	if m.tg == nil {
		return 1
	}
	return Cost(Estimate(m.tg.status.Load()), m.tg.inFlight.Load())
}

// pickP2C draws two distinct random members of g and takes the available
// one of lower cost (the first drawn on a tie). If neither is available it
// falls back to the first available member from a random start.
func (s *Selector[U]) pickP2C(g []member[U]) (member[U], bool) {
	n := len(g)
	if n < 2 {
		return s.pickRandom(g)
	}
	i, j := s.two(n)
	a, b := &g[i], &g[j]
	aok, bok := s.Host.Available(a.u), s.Host.Available(b.u)
	switch {
	case aok && bok:
		if b.cost() < a.cost() {
			return *b, true
		}
		return *a, true
	case aok:
		return *a, true
	case bok:
		return *b, true
	}
	return s.pickRandom(g)
}

// two draws two distinct indices below n (n ≥ 2) from one random word:
// a pick costs one call to the generator, as random's does.
func (s *Selector[U]) two(n int) (i, j int) {
	if s.IntN != nil {
		i, j = s.IntN(n), s.IntN(n-1)
	} else {
		x := rand.Uint64()
		i, j = int(uint32(x)%uint32(n)), int(uint32(x>>32)%uint32(n-1))
	}
	if j >= i {
		j++
	}
	return i, j
}
