// Package bounded is the table shared by everything keyed by values that
// clients control (sticky pairs, rate-limit peers): a map from 64-bit keys
// to values that holds at most a fixed number of entries, forgets entries
// idle longer than a TTL, and evicts one not used recently when a new key
// arrives at a full table.
//
// The bound is exact: a table of n entries holds n keys before it evicts
// any, whatever the spread of keys over its shards. Eviction is CLOCK
// (second chance), the usual close approximation of least-recently-used: a
// use marks an entry, and the eviction hand, sweeping a shard's entries in
// turn, clears marks and takes the first unmarked entry — one not used
// since the hand last passed it, never one in use in the meantime. A hit
// writes nothing when its entry is already marked in the current second,
// so it costs a map lookup, as a plain map would. A table below 4096
// entries is one shard (an exact CLOCK); a larger one has up to 64, and
// evicts from whichever of a few sampled shards offers the candidate used
// longest ago. The number of shards is fixed when the table is made.
//
// Times are whole seconds (unix): an entry's idle time is known to within
// one second.
package bounded

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

const (
	// MaxShards is the most shards a table has (a power of two; shards
	// spread lock contention).
	MaxShards = 64
	shardMin  = 2048 // a shard is not split below this many entries
	// evictSamples is how many shards an eviction compares (all of them
	// when there are fewer).
	evictSamples = 5
	usedBit      = 1 << 31 // in an entry's slot: a use since the hand passed
)

// Table maps keys to values of type V. It is safe for concurrent use; keys
// are spread over shards by their top bits, so they should be hashes.
type Table[V any] struct {
	ttl   atomic.Int64 // seconds; 0 = no idle expiry
	max   atomic.Int64
	count atomic.Int64 // entries held plus insertions in progress
	shift uint         // key >> shift is the shard index
	// shards are allocated once; their number depends on the bound the
	// table was made with.
	shards []shard[V]
}

// A shard's map holds the entries, so a hit reads one place; the clock
// face (ring) only lists the keys in slot order for the eviction hand. A
// slot is live while its key's entry names it.
type shard[V any] struct {
	mu    sync.Mutex
	index map[uint64]entry[V]
	ring  []uint64 // key per slot
	free  []uint32 // slots of removed entries
	hand  int
	_     [16]byte
}

type entry[V any] struct {
	value V
	seen  uint32 // unix seconds of the last use
	slot  uint32 // place on the clock face | usedBit
}

// New returns a table holding at most maxEntries keys (at least 1).
func New[V any](maxEntries int) *Table[V] {
	maxEntries = max(1, maxEntries)
	n := 1
	for n < MaxShards && maxEntries/(2*n) >= shardMin {
		n *= 2
	}
	t := &Table[V]{shift: uint(64 - bits.TrailingZeros(uint(n))), shards: make([]shard[V], n)}
	for i := range t.shards {
		t.shards[i].index = make(map[uint64]entry[V])
	}
	t.SetLimits(maxEntries, 0)
	return t
}

// SetLimits changes the bound and the idle TTL (seconds; 0: none) of a
// table in use, as a reload does. Lowering the bound evicts entries down
// to it at once, in eviction order; raising it takes effect for the next
// insertions.
func (t *Table[V]) SetLimits(maxEntries int, ttlSeconds int64) {
	t.ttl.Store(max(0, ttlSeconds))
	t.max.Store(int64(max(1, maxEntries)))
	for t.count.Load() > t.max.Load() && t.evictOne() {
	}
}

// Max returns the bound.
func (t *Table[V]) Max() int { return int(t.max.Load()) }

// Shards returns the number of shards (fixed when the table is made).
func (t *Table[V]) Shards() int { return len(t.shards) }

// shard picks by the key's top bits; with one shard, shift is 64 and Go
// defines key>>64 as 0.
func (t *Table[V]) shard(key uint64) *shard[V] { return &t.shards[key>>t.shift] }

func (t *Table[V]) expired(seen, sec uint32) bool {
	ttl := t.ttl.Load()
	return ttl > 0 && int64(sec)-int64(seen) > ttl
}

// Get returns key's value and marks it used at sec. An entry idle past
// the TTL is removed and reported missing.
func (t *Table[V]) Get(key uint64, sec uint32) (V, bool) {
	s := t.shard(key)
	s.mu.Lock()
	e, ok := s.index[key]
	if !ok {
		s.mu.Unlock()
		var zero V
		return zero, false
	}
	if t.expired(e.seen, sec) {
		s.remove(key, e)
		s.mu.Unlock()
		t.count.Add(-1)
		var zero V
		return zero, false
	}
	s.touch(key, e, sec)
	s.mu.Unlock()
	return e.value, true
}

// touch marks e used at sec; s.mu is held. At most one write per entry
// per second.
func (s *shard[V]) touch(key uint64, e entry[V], sec uint32) {
	if e.seen != sec || e.slot&usedBit == 0 {
		e.seen, e.slot = sec, e.slot|usedBit
		s.index[key] = e
	}
}

// Put sets key's value and marks it used. A new key at a full table first
// evicts an entry (see the package comment).
func (t *Table[V]) Put(key uint64, value V, sec uint32) {
	t.upsert(key, sec, func(V, bool) V { return value })
}

// GetOrPut returns key's value, marking it used, or stores and returns
// fresh() if key is missing (or idle past the TTL).
func (t *Table[V]) GetOrPut(key uint64, sec uint32, fresh func() V) V {
	s := t.shard(key)
	s.mu.Lock()
	if e, ok := s.index[key]; ok && !t.expired(e.seen, sec) {
		s.touch(key, e, sec)
		s.mu.Unlock()
		return e.value
	}
	s.mu.Unlock()
	return t.upsert(key, sec, func(old V, ok bool) V {
		if ok {
			return old
		}
		return fresh()
	})
}

// upsert stores set(old value, present) under key and returns it.
func (t *Table[V]) upsert(key uint64, sec uint32, set func(V, bool) V) V {
	s := t.shard(key)
	s.mu.Lock()
	if v, ok := s.update(t, key, sec, set); ok {
		s.mu.Unlock()
		return v
	}
	if t.count.Add(1) > t.max.Load() {
		// Evict outside this shard's lock: the victim may be in any shard.
		s.mu.Unlock()
		if !t.evictOne() {
			// Nothing to evict: the rest is in flight. Hand out a value
			// that is not kept rather than exceed the bound.
			t.count.Add(-1)
			var zero V
			return set(zero, false)
		}
		s.mu.Lock()
		if v, ok := s.update(t, key, sec, set); ok { // another goroutine inserted key meanwhile
			s.mu.Unlock()
			t.count.Add(-1)
			return v
		}
	}
	var zero V
	v := set(zero, false)
	s.insert(key, v, sec)
	s.mu.Unlock()
	return v
}

// update sets an existing, live key's entry; s.mu is held. An entry idle
// past the TTL is removed first and reported missing.
func (s *shard[V]) update(t *Table[V], key uint64, sec uint32, set func(V, bool) V) (V, bool) {
	e, ok := s.index[key]
	if ok && t.expired(e.seen, sec) {
		s.remove(key, e)
		t.count.Add(-1)
		ok = false
	}
	if !ok {
		var zero V
		return zero, false
	}
	e.value, e.seen, e.slot = set(e.value, true), sec, e.slot|usedBit
	s.index[key] = e
	return e.value, true
}

// evictOne removes the candidate of the sampled shard whose candidate (the
// entry its hand would take next) was used longest ago. It reports false
// if the sampled shards, then all shards, are empty.
func (t *Table[V]) evictOne() bool {
	n := len(t.shards)
	start := 0
	if n > evictSamples {
		start = rand.IntN(n)
	}
	if t.evictFrom(start, min(n, evictSamples)) {
		return true
	}
	return n > evictSamples && t.evictFrom(0, n)
}

func (t *Table[V]) evictFrom(start, count int) bool {
	best, bestSeen, bestLen := -1, uint32(0), 0
	for j := range count {
		i := (start + j) % len(t.shards)
		s := &t.shards[i]
		s.mu.Lock()
		if _, e, ok := s.candidate(); ok {
			// Candidates used in the same second tie (a flood makes many):
			// then the fuller shard gives one up, which keeps the shards
			// even, so each one's hand turns at the pace of its own share
			// of the new keys — as one clock over the whole table would.
			// (Always taking the first would sweep one shard's entries,
			// those in use included, many times faster than the others'.)
			if n := len(s.index); best < 0 || e.seen < bestSeen || (e.seen == bestSeen && n > bestLen) {
				best, bestSeen, bestLen = i, e.seen, n
			}
		}
		s.mu.Unlock()
	}
	if best < 0 {
		return false
	}
	s := &t.shards[best]
	s.mu.Lock()
	key, e, ok := s.candidate() // the same one, unless it was used meanwhile
	if !ok {                    // emptied meanwhile
		s.mu.Unlock()
		return t.evictFrom(start, count)
	}
	s.remove(key, e)
	s.hand++ // past the freed slot: an entry put there has a full turn ahead
	s.mu.Unlock()
	t.count.Add(-1)
	return true
}

// Delete forgets key.
func (t *Table[V]) Delete(key uint64) {
	s := t.shard(key)
	s.mu.Lock()
	e, ok := s.index[key]
	if ok {
		s.remove(key, e)
	}
	s.mu.Unlock()
	if ok {
		t.count.Add(-1)
	}
}

// RemoveIf forgets every entry for which match(value, last use) holds and
// returns how many it forgot.
func (t *Table[V]) RemoveIf(match func(V, uint32) bool) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.index {
			if match(e.value, e.seen) {
				s.remove(k, e)
				removed++
			}
		}
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
	return removed
}

// Sweep removes every entry idle past the TTL at sec and returns how many
// it removed. Get expires entries too; Sweep, run periodically, frees the
// memory of keys that never come back.
func (t *Table[V]) Sweep(sec uint32) int {
	if t.ttl.Load() == 0 {
		return 0
	}
	return t.RemoveIf(func(_ V, seen uint32) bool { return t.expired(seen, sec) })
}

// Each calls f with the value of every entry not idle past the TTL at
// sec, under its shard's lock (f must not use the table).
func (t *Table[V]) Each(sec uint32, f func(V)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.index {
			if !t.expired(e.seen, sec) {
				f(e.value)
			}
		}
		s.mu.Unlock()
	}
}

// Clear forgets every entry.
func (t *Table[V]) Clear() {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		removed += len(s.index)
		s.index = make(map[uint64]entry[V])
		s.ring, s.free, s.hand = nil, nil, 0
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
}

// Len returns the number of entries, expired ones not yet swept included.
func (t *Table[V]) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.index)
		s.mu.Unlock()
	}
	return n
}

// insert adds a new, not yet marked key; s.mu is held. It takes a free
// slot (behind the hand, when eviction freed it) or grows the face.
func (s *shard[V]) insert(key uint64, value V, sec uint32) {
	var i uint32
	if n := len(s.free); n > 0 {
		i, s.free = s.free[n-1], s.free[:n-1]
		s.ring[i] = key
	} else {
		i = uint32(len(s.ring))
		s.ring = append(s.ring, key)
	}
	s.index[key] = entry[V]{value: value, seen: sec, slot: i}
}

// candidate moves the hand to the next unmarked entry, clearing marks on
// the way (the second chance), and returns it; s.mu is held. Two turns at
// most: the first clears every mark.
func (s *shard[V]) candidate() (uint64, entry[V], bool) {
	if len(s.index) == 0 {
		return 0, entry[V]{}, false
	}
	for range 2*len(s.ring) + 1 {
		if s.hand >= len(s.ring) {
			s.hand = 0
		}
		key := s.ring[s.hand]
		e, ok := s.index[key]
		switch {
		case !ok || e.slot&^usedBit != uint32(s.hand): // a free slot
		case e.slot&usedBit != 0:
			e.slot &^= usedBit
			s.index[key] = e
		default:
			return key, e, true
		}
		s.hand++
	}
	return 0, entry[V]{}, false
}

// remove forgets key (whose entry is e) and frees its slot; s.mu is held.
func (s *shard[V]) remove(key uint64, e entry[V]) {
	delete(s.index, key)
	s.free = append(s.free, e.slot&^usedBit)
}
