package pubsel

import (
	"sync"
	"sync/atomic"
)

// pendingSet is the table keys of local pins made without the store's
// word, awaiting reconciliation: bounded (maxPending), each forgotten
// after a sticky TTL (its local pin has expired by then).
type pendingSet struct {
	n  atomic.Int32
	mu sync.Mutex
	m  map[uint64]pendingPin
}

type pendingPin struct{ since, next int64 } // unix ns: made; earliest next attempt

// maxPending bounds the pins awaiting reconciliation (about 40 bytes
// each); past it a pin is not tracked (counted in PendingDropped) and is
// written back by the half-TTL renewal instead.
const maxPending = 65536

// add tracks key, made at now; false if the list is full.
func (p *pendingSet) add(key uint64, now, ttl int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[uint64]pendingPin{}
	}
	if _, ok := p.m[key]; !ok && len(p.m) >= maxPending {
		for k, e := range p.m {
			if now-e.since >= ttl {
				delete(p.m, k)
			}
		}
		if len(p.m) >= maxPending {
			return false
		}
	}
	p.m[key] = pendingPin{since: now, next: now}
	p.n.Store(int32(len(p.m)))
	return true
}

// take says whether key is pending and due for an attempt at now; if so
// the next attempt is put off by retry, so concurrent hits start one.
func (p *pendingSet) take(key uint64, now, retry, ttl int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.m[key]
	switch {
	case !ok:
		return false
	case now-e.since >= ttl:
		delete(p.m, key)
		p.n.Store(int32(len(p.m)))
		return false
	case now < e.next:
		return false
	}
	e.next = now + retry
	p.m[key] = e
	return true
}

// done forgets key (reconciled, or the store answered for the pair).
func (p *pendingSet) done(key uint64) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[key]; ok {
		delete(p.m, key)
		p.n.Store(int32(len(p.m)))
	}
}
