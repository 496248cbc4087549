package placement

import "time"

// Change is one change of a tenant's partition count by Auto.
type Change struct {
	Time     time.Time
	Tenant   string
	Grew     bool // grew (else shrank)
	From, To int  // k before and after
	Reason   string
}

// HistoryLength is how many changes the placer keeps: the most recent.
const HistoryLength = 100

// changeRing holds the last HistoryLength changes; the placer's am guards it.
type changeRing struct {
	buf  [HistoryLength]Change
	next int // where the next change goes
	n    int // changes held
}

func (r *changeRing) add(c Change) {
	r.buf[r.next] = c
	r.next = (r.next + 1) % HistoryLength
	r.n = min(r.n+1, HistoryLength)
}

// list returns the changes held, oldest first.
func (r *changeRing) list() []Change {
	out := make([]Change, 0, r.n)
	for i := range r.n {
		out = append(out, r.buf[(r.next-r.n+i+HistoryLength)%HistoryLength])
	}
	return out
}

// History returns the last HistoryLength partition changes by Auto, oldest
// first.
func (p *Placer) History() []Change {
	p.am.Lock()
	defer p.am.Unlock()
	return p.history.list()
}
