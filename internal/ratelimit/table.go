package ratelimit

import (
	"hash/maphash"
	"sync"

	"github.com/edgesteer/edgesteer/internal/bounded"
)

const shardCount = 64

// Table holds one Bucket per key (a peer, a peer and message type), for
// keys that clients control: it is bounded, and when full it drops the
// least recently used of a few sampled entries. A dropped bucket that had
// refilled loses nothing; only under a flood of more live keys than the
// bound does a key restart with a full burst. Keys are stored as 64-bit
// hashes (two keys sharing one would share a bucket; odds ~n²/2⁶⁵).
type Table struct {
	seed   maphash.Seed
	shards [shardCount]tableShard
}

type tableShard struct {
	mu  sync.Mutex
	m   map[uint64]*entry
	cap int
	_   [40]byte
}

type entry struct {
	Bucket
	seen int64 // unix ns of the last use, under the shard lock
}

// NewTable returns a table of at most size buckets (at least 64).
func NewTable(size int) *Table {
	t := &Table{seed: maphash.MakeSeed()}
	per := max(1, size/shardCount)
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]*entry)
		t.shards[i].cap = per
	}
	return t
}

// SetSize changes the bound to size buckets (at least 64), as a reload
// that changes max_peers does: a lowered bound evicts at once (the least
// recently used of sampled entries, as when full), a raised one only lets
// the table grow.
func (t *Table) SetSize(size int) {
	per := max(1, size/shardCount)
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.cap = per
		for len(s.m) > per {
			bounded.EvictOldest(s.m, func(e *entry) int64 { return e.seen })
		}
		s.mu.Unlock()
	}
}

// Bucket returns key's bucket, creating it if needed.
func (t *Table) Bucket(key string, now int64) *Bucket {
	h := maphash.String(t.seed, key)
	s := &t.shards[h>>58]
	s.mu.Lock()
	e := s.m[h]
	if e == nil {
		if len(s.m) >= s.cap {
			bounded.EvictOldest(s.m, func(e *entry) int64 { return e.seen })
		}
		e = &entry{}
		s.m[h] = e
	}
	e.seen = now
	s.mu.Unlock()
	return &e.Bucket
}

// Rescale multiplies every bucket's debt at now (tat − now, where
// positive) by factor: a reload that changes a rate from r to r' keeps the
// number of admissions each key has outstanding with factor r/r'.
func (t *Table) Rescale(factor float64, now int64) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			for {
				old := e.tat.Load()
				if old <= now || e.tat.CompareAndSwap(old, now+int64(float64(old-now)*factor)) {
					break
				}
			}
		}
		s.mu.Unlock()
	}
}

// Len returns the number of buckets.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Sweep drops buckets unused since before idleBefore whose GCRA state has
// refilled (tat ≤ now), and returns how many it dropped.
func (t *Table) Sweep(idleBefore, now int64) int {
	dropped := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if e.seen < idleBefore && e.tat.Load() <= now {
				delete(s.m, k)
				dropped++
			}
		}
		s.mu.Unlock()
	}
	return dropped
}
