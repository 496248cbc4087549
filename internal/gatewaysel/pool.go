package gatewaysel

import (
	"sync"
)

// Pool holds Tables by a stable name across configuration reloads: a
// reload builds its new configuration while the old one still serves, so the
// new one takes a lease on the same name (adopting the Table, its cached
// results and its probe runs in flight, with the new settings applied by
// Reconfigure) before the old one lets go. A Table is closed (background
// work stopped, cache file saved) when its last lease is released.
type Pool struct {
	mu     sync.Mutex
	seq    uint64
	states map[string]*pooled
}

type pooled struct {
	sel    *Table
	leases map[uint64]bool
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{states: map[string]*pooled{}} }

// Lease is one holder's claim on a pooled Table.
type Lease struct {
	pool *Pool
	name string
	seq  uint64
	sel  *Table
}

// Table returns the leased Table.
func (l *Lease) Table() *Table { return l.sel }

// Acquired is what Acquire did.
type Acquired struct {
	*Lease
	Adopted bool   // the Table already existed: cfg was applied to it
	Change  Change // with Adopted, what cfg changed
	Loaded  int    // without Adopted, locations read from cfg.CacheFile
	LoadErr error  // without Adopted, why the cache file could not be read
}

// Acquire leases the Table named name, creating it from cfg (reading its
// cache file and starting its background work) or, when it exists, applying
// cfg to it.
func (p *Pool) Acquire(name string, cfg Config) (Acquired, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var a Acquired
	st := p.states[name]
	if st != nil {
		ch, err := st.sel.Reconfigure(cfg)
		if err != nil {
			return a, err
		}
		a.Adopted, a.Change = true, ch
	} else {
		sel, err := NewTable(cfg)
		if err != nil {
			return a, err
		}
		if cfg.CacheFile != "" {
			a.Loaded, a.LoadErr = sel.Load(cfg.CacheFile)
		}
		sel.Start()
		st = &pooled{sel: sel, leases: map[uint64]bool{}}
		p.states[name] = st
	}
	p.seq++
	st.leases[p.seq] = true
	a.Lease = &Lease{pool: p, name: name, seq: p.seq, sel: st.sel}
	return a, nil
}

// Release gives the lease up; the last one closes the Table and returns
// Close's error. Releasing twice is harmless.
func (l *Lease) Release() error {
	l.pool.mu.Lock()
	defer l.pool.mu.Unlock()
	return l.pool.release(l.name, l.seq)
}

// release is called with p.mu held.
func (p *Pool) release(name string, seq uint64) error {
	st := p.states[name]
	if st == nil || !st.leases[seq] {
		return nil
	}
	delete(st.leases, seq)
	if len(st.leases) > 0 {
		return nil
	}
	delete(p.states, name)
	return st.sel.Close()
}

// Mark returns a point in the sequence of leases, for ReleaseSince.
func (p *Pool) Mark() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// ReleaseSince releases every lease taken after mark: those of a
// configuration that failed to start after taking them.
func (p *Pool) ReleaseSince(mark uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, st := range p.states {
		for seq := range st.leases {
			if seq > mark {
				p.release(name, seq)
			}
		}
	}
}

// Leases returns how many leases name has (0: not held).
func (p *Pool) Leases(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.states[name]; st != nil {
		return len(st.leases)
	}
	return 0
}
