package pubsel

import (
	"sync"
	"sync/atomic"
	"time"
)

// Picks counts one policy's decisions by publisher, bucket label and
// decision (new or sticky): the figures the adapters' selections metric
// and admin views read. A count is never dropped: a publisher that leaves
// the pool, or whose target is removed, keeps its counts, and they go on
// if it comes back. One Picks may serve many selectors (config
// generations) at once.
//
// Count is the request path: the counts in force for each target id are
// cached in a copy-on-write slice with the status they were resolved for,
// so counting is an index, a pointer compare and an atomic add. A status
// is never changed once published (the tracker publishes a new one), so
// the same status means the same address and bucket label; a new status
// of the target (every probe round or re-evaluation) takes the lock once.
type Picks struct {
	mu     sync.Mutex
	counts map[pickKey]*pickCount // under mu; never deleted
	slots  atomic.Pointer[[]pickSlot]
}

type pickKey struct {
	addr, label string
	sticky      bool
}

type pickCount struct {
	n       atomic.Uint64
	created time.Time
}

// pickSlot is one target id's counts in its current bucket: [new, sticky],
// nil until the first such decision, resolved for status st.
type pickSlot struct {
	st *Status
	c  [2]*pickCount
}

// PickCount is one count of Picks.Counts.
type PickCount struct {
	Addr    string
	Label   string // the bucket's label when the picks were made
	Sticky  bool
	N       uint64
	Created time.Time // the first such pick
}

// Count counts a decision for st (nil: a publisher not probed, not
// counted), sticky or new.
func (p *Picks) Count(st *Status, sticky bool) {
	if st == nil {
		return
	}
	i := 0
	if sticky {
		i = 1
	}
	if s := p.slots.Load(); s != nil && int(st.ID) < len(*s) {
		if e := &(*s)[st.ID]; e.st == st && e.c[i] != nil {
			e.c[i].n.Add(1)
			return
		}
	}
	p.slot(st, i).n.Add(1)
}

// slot caches st's count for decision i (0 new, 1 sticky) and returns it.
func (p *Picks) slot(st *Status, i int) *pickCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s []pickSlot
	if old := p.slots.Load(); old != nil {
		s = *old
	}
	s = append(make([]pickSlot, 0, max(len(s), int(st.ID)+1)), s...)
	s = s[:max(len(s), int(st.ID)+1)]
	e := &s[st.ID]
	if e.st == nil || e.st.Label != st.Label || e.st.Addr != st.Addr {
		*e = pickSlot{}
	}
	e.st = st
	if e.c[i] == nil {
		k := pickKey{st.Addr, st.Label, i == 1}
		if p.counts == nil {
			p.counts = map[pickKey]*pickCount{}
		}
		if p.counts[k] == nil {
			p.counts[k] = &pickCount{created: time.Now()}
		}
		e.c[i] = p.counts[k]
	}
	p.slots.Store(&s)
	return e.c[i]
}

// Counts returns every count, in no particular order (none for nil).
func (p *Picks) Counts() []PickCount {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PickCount, 0, len(p.counts))
	for k, c := range p.counts {
		out = append(out, PickCount{Addr: k.addr, Label: k.label, Sticky: k.sticky, N: c.n.Load(), Created: c.created})
	}
	return out
}

// Totals returns the picks of each publisher, new and sticky over every
// bucket, and the sticky decisions of all publishers.
func (p *Picks) Totals() (byAddr map[string]uint64, sticky uint64) {
	byAddr = map[string]uint64{}
	for _, c := range p.Counts() {
		byAddr[c.Addr] += c.N
		if c.Sticky {
			sticky += c.N
		}
	}
	return byAddr, sticky
}
