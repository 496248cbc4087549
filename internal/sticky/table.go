// Package sticky is a bounded affinity table: it remembers which target a
// (user, app) pair was sent to, forgets pairs idle longer than a TTL, and
// when full evicts an old pair, chosen like Redis's approximate LRU: the
// least recently used of a few sampled entries.
//
// Keys are 64-bit hashes of the pair and values are 32-bit target ids with a
// 32-bit last-use second, so an entry costs a fixed few dozen bytes whatever
// the strings' length (BenchmarkStickyHit reports B/entry). Two pairs sharing
// a hash (odds about n²/2⁶⁵ for n entries) would share a target, which
// stickiness tolerates. Times are whole seconds: an entry's idle time is
// known to within one second.
package sticky

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/bounded"
)

const (
	shardCount    = 64 // power of two; spreads lock contention
	secondsPerSec = int64(time.Second)
)

// Table maps pair hashes to target ids. It is safe for concurrent use.
type Table struct {
	seed   maphash.Seed
	ttl    int64 // seconds; 0 = no idle expiry
	shards [shardCount]shard
}

type shard struct {
	mu       sync.Mutex
	m        map[uint64]slot
	capacity int
	_        [40]byte // keep shards on separate cache lines
}

type slot struct {
	value uint32
	seen  uint32 // unix seconds of the last use
}

// New returns a table holding at most maxEntries pairs (rounded down to a
// multiple of 64, the shard count, and at least 64), each forgotten after
// ttl without use (0: never; below a second counts as a second).
func New(maxEntries int, ttl time.Duration) *Table {
	t := &Table{seed: maphash.MakeSeed()}
	if ttl > 0 {
		t.ttl = max(1, int64(ttl/time.Second))
	}
	per := max(1, maxEntries/shardCount)
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]slot)
		t.shards[i].capacity = per
	}
	return t
}

// Key hashes a (user, app) pair. ("ab", "c") and ("a", "bc") differ.
func (t *Table) Key(user, app string) uint64 {
	h := maphash.String(t.seed, user)
	return (h^(h>>29))*0x9E3779B97F4A7C15 ^ maphash.String(t.seed, app)
}

func (t *Table) shard(key uint64) *shard { return &t.shards[key>>58] }

func seconds(now int64) uint32 { return uint32(now / secondsPerSec) }

func (t *Table) expired(s slot, sec uint32) bool {
	return t.ttl > 0 && int64(sec)-int64(s.seen) > t.ttl
}

// Get returns the target for key and marks it used at now (unix ns). An
// entry idle past the TTL is removed and reported missing.
func (t *Table) Get(key uint64, now int64) (uint32, bool) {
	sec := seconds(now)
	s := t.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if !ok {
		s.mu.Unlock()
		return 0, false
	}
	if t.expired(e, sec) {
		delete(s.m, key)
		s.mu.Unlock()
		return 0, false
	}
	if e.seen != sec { // at most one write per entry per second
		e.seen = sec
		s.m[key] = e
	}
	s.mu.Unlock()
	return e.value, true
}

// Put sets key's target. When the key is new and its shard is full, it first
// evicts the least recently used of a few sampled entries.
func (t *Table) Put(key uint64, value uint32, now int64) {
	sec := seconds(now)
	s := t.shard(key)
	s.mu.Lock()
	if _, ok := s.m[key]; !ok && len(s.m) >= s.capacity {
		bounded.EvictOldest(s.m, func(e slot) int64 { return int64(e.seen) })
	}
	s.m[key] = slot{value: value, seen: sec}
	s.mu.Unlock()
}

// Delete forgets key.
func (t *Table) Delete(key uint64) {
	s := t.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// Len returns the number of entries, expired ones not yet swept included.
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

// Counts returns how many live entries point at each target.
func (t *Table) Counts(now int64) map[uint32]int {
	sec := seconds(now)
	out := map[uint32]int{}
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			if !t.expired(e, sec) {
				out[e.value]++
			}
		}
		s.mu.Unlock()
	}
	return out
}

// Sweep removes every entry idle past the TTL and returns how many it
// removed. Get expires entries too; Sweep, run periodically, frees the
// memory of pairs that never come back.
func (t *Table) Sweep(now int64) int {
	if t.ttl == 0 {
		return 0
	}
	sec, n := seconds(now), 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if t.expired(e, sec) {
				delete(s.m, k)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}
