// Package sticky is a bounded affinity table: it remembers which target a
// (user, app) pair was sent to, forgets pairs idle longer than a TTL, and
// holds at most a fixed number of pairs, evicting one not used recently
// when a new pair arrives at a full table.
//
// The bound is exact: a table of n entries holds n pairs before it evicts
// any, whatever the spread of keys over its shards. Eviction is CLOCK
// (second chance), the usual close approximation of least-recently-used: a
// use marks an entry, and the eviction hand, sweeping a shard's entries in
// turn, clears marks and takes the first unmarked entry — one not used
// since the hand last passed it, never one in use in the meantime. A hit
// writes nothing when its entry is already marked in the current second,
// so it costs a map lookup, as a plain map would. A table below 4096
// entries is one shard; a larger one has up to 64, and evicts from
// whichever of a few sampled shards offers the candidate used longest ago.
//
// Keys are 64-bit hashes of the pair and values are 31-bit target ids with
// a 32-bit last-use second, so an entry costs a fixed few dozen bytes
// whatever the strings' length (BenchmarkStickyHit reports B/entry). Two
// pairs sharing a hash (odds about n²/2⁶⁵ for n entries) would share a
// target, which stickiness tolerates. Times are whole seconds: an entry's
// idle time is known to within one second.
package sticky

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

const (
	maxShards = 64   // power of two; spreads lock contention
	shardMin  = 2048 // a shard is not split below this many entries
	// evictSamples is how many shards an eviction compares (all of them
	// when there are fewer).
	evictSamples  = 5
	secondsPerSec = int64(time.Second)
	// MaxValue is the largest value a table stores; the top bit of an
	// entry's value marks a recent use.
	MaxValue = 1<<31 - 1
	usedBit  = 1 << 31
)

// Table maps pair hashes to target ids. It is safe for concurrent use.
type Table struct {
	seed  maphash.Seed
	ttl   atomic.Int64 // seconds; 0 = no idle expiry
	max   atomic.Int64
	count atomic.Int64 // entries held plus insertions in progress
	shift uint         // key >> shift is the shard index
	// shards are allocated once; their number depends on the bound the
	// table was made with.
	shards []shard
}

// A shard's map holds the entries, so a hit reads one place; the clock
// face (ring) only lists the keys in slot order for the eviction hand. A
// slot is live while its key's entry names it.
type shard struct {
	mu    sync.Mutex
	index map[uint64]entry
	ring  []uint64 // key per slot
	free  []uint32 // slots of removed entries
	hand  int
	_     [16]byte
}

type entry struct {
	value uint32 // target | usedBit
	seen  uint32 // unix seconds of the last use
	slot  uint32 // place on the clock face
}

// New returns a table holding at most maxEntries pairs (at least 1), each
// forgotten after ttl without use (0: never; below a second counts as a
// second).
func New(maxEntries int, ttl time.Duration) *Table {
	maxEntries = max(1, maxEntries)
	n := 1
	for n < maxShards && maxEntries/(2*n) >= shardMin {
		n *= 2
	}
	t := &Table{seed: maphash.MakeSeed(), shift: uint(64 - bits.TrailingZeros(uint(n))), shards: make([]shard, n)}
	for i := range t.shards {
		t.shards[i].index = make(map[uint64]entry)
	}
	t.SetLimits(maxEntries, ttl)
	return t
}

// SetLimits changes the bound and the idle TTL of a table in use, as a
// reload does. Lowering the bound evicts entries down to it at once, in
// eviction order; raising it takes effect for the next insertions.
func (t *Table) SetLimits(maxEntries int, ttl time.Duration) {
	var sec int64
	if ttl > 0 {
		sec = max(1, int64(ttl/time.Second))
	}
	t.ttl.Store(sec)
	t.max.Store(int64(max(1, maxEntries)))
	for t.count.Load() > t.max.Load() && t.evictOne() {
	}
}

// Max returns the bound.
func (t *Table) Max() int { return int(t.max.Load()) }

// Shards returns the number of shards (fixed when the table is made).
func (t *Table) Shards() int { return len(t.shards) }

// Key hashes a (user, app) pair. ("ab", "c") and ("a", "bc") differ.
func (t *Table) Key(user, app string) uint64 {
	h := maphash.String(t.seed, user)
	return (h^(h>>29))*0x9E3779B97F4A7C15 ^ maphash.String(t.seed, app)
}

// shard picks by the key's top bits; with one shard, shift is 64 and Go
// defines key>>64 as 0.
func (t *Table) shard(key uint64) *shard { return &t.shards[key>>t.shift] }

func seconds(now int64) uint32 { return uint32(now / secondsPerSec) }

func (t *Table) expired(seen, sec uint32) bool {
	ttl := t.ttl.Load()
	return ttl > 0 && int64(sec)-int64(seen) > ttl
}

// Get returns the target for key and marks it used at now (unix ns). An
// entry idle past the TTL is removed and reported missing.
func (t *Table) Get(key uint64, now int64) (uint32, bool) {
	sec := seconds(now)
	s := t.shard(key)
	s.mu.Lock()
	e, ok := s.index[key]
	if !ok {
		s.mu.Unlock()
		return 0, false
	}
	if t.expired(e.seen, sec) {
		s.remove(key, e)
		s.mu.Unlock()
		t.count.Add(-1)
		return 0, false
	}
	if e.seen != sec || e.value&usedBit == 0 { // at most one write per entry per second
		e.seen, e.value = sec, e.value|usedBit
		s.index[key] = e
	}
	s.mu.Unlock()
	return e.value &^ usedBit, true
}

// Put sets key's target (at most MaxValue) and marks it used. A new key at
// a full table first evicts an entry (see the package comment).
func (t *Table) Put(key uint64, value uint32, now int64) {
	if value > MaxValue {
		panic("sticky: value out of range")
	}
	sec := seconds(now)
	s := t.shard(key)
	s.mu.Lock()
	if t.update(s, key, value, sec) {
		s.mu.Unlock()
		return
	}
	if t.count.Add(1) > t.max.Load() {
		// Evict outside this shard's lock: the victim may be in any shard.
		s.mu.Unlock()
		if !t.evictOne() {
			t.count.Add(-1) // nothing to evict: the rest is in flight
			return
		}
		s.mu.Lock()
		if t.update(s, key, value, sec) { // another Put inserted key meanwhile
			s.mu.Unlock()
			t.count.Add(-1)
			return
		}
	}
	s.insert(key, value, sec)
	s.mu.Unlock()
}

// update sets an existing key's entry; s.mu is held.
func (t *Table) update(s *shard, key uint64, value, sec uint32) bool {
	e, ok := s.index[key]
	if !ok {
		return false
	}
	e.value, e.seen = value|usedBit, sec
	s.index[key] = e
	return true
}

// evictOne removes the candidate of the sampled shard whose candidate (the
// entry its hand would take next) was used longest ago. It reports false
// if the sampled shards, then all shards, are empty.
func (t *Table) evictOne() bool {
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

func (t *Table) evictFrom(start, count int) bool {
	best, bestSeen := -1, uint32(0)
	for j := range count {
		i := (start + j) % len(t.shards)
		s := &t.shards[i]
		s.mu.Lock()
		if _, e, ok := s.candidate(); ok {
			if best < 0 || e.seen < bestSeen {
				best, bestSeen = i, e.seen
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
func (t *Table) Delete(key uint64) {
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

// DeleteValue forgets every pair pointing at value (a target that is gone)
// and returns how many it forgot.
func (t *Table) DeleteValue(value uint32) int {
	return t.removeIf(func(e entry) bool { return e.value&^usedBit == value })
}

// Clear forgets every pair.
func (t *Table) Clear() {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		removed += len(s.index)
		s.index = make(map[uint64]entry)
		s.ring, s.free, s.hand = nil, nil, 0
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
}

// Len returns the number of entries, expired ones not yet swept included.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.index)
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
		for _, e := range s.index {
			if !t.expired(e.seen, sec) {
				out[e.value&^usedBit]++
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
	if t.ttl.Load() == 0 {
		return 0
	}
	sec := seconds(now)
	return t.removeIf(func(e entry) bool { return t.expired(e.seen, sec) })
}

func (t *Table) removeIf(match func(entry) bool) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.index {
			if match(e) {
				s.remove(k, e)
				removed++
			}
		}
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
	return removed
}

// insert adds a new, not yet marked key; s.mu is held. It takes a free
// slot (behind the hand, when eviction freed it) or grows the face.
func (s *shard) insert(key uint64, value, sec uint32) {
	var i uint32
	if n := len(s.free); n > 0 {
		i, s.free = s.free[n-1], s.free[:n-1]
		s.ring[i] = key
	} else {
		i = uint32(len(s.ring))
		s.ring = append(s.ring, key)
	}
	s.index[key] = entry{value: value, seen: sec, slot: i}
}

// candidate moves the hand to the next unmarked entry, clearing marks on
// the way (the second chance), and returns it; s.mu is held. Two turns at
// most: the first clears every mark.
func (s *shard) candidate() (uint64, entry, bool) {
	if len(s.index) == 0 {
		return 0, entry{}, false
	}
	for range 2*len(s.ring) + 1 {
		if s.hand >= len(s.ring) {
			s.hand = 0
		}
		key := s.ring[s.hand]
		e, ok := s.index[key]
		switch {
		case !ok || e.slot != uint32(s.hand): // a free slot
		case e.value&usedBit != 0:
			e.value &^= usedBit
			s.index[key] = e
		default:
			return key, e, true
		}
		s.hand++
	}
	return 0, entry{}, false
}

// remove forgets key (whose entry is e) and frees its slot; s.mu is held.
func (s *shard) remove(key uint64, e entry) {
	delete(s.index, key)
	s.free = append(s.free, e.slot)
}
