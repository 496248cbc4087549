// Package sticky is a bounded affinity table: it remembers which target a
// (user, app) pair was sent to, forgets pairs idle longer than a TTL, and
// holds at most a fixed number of pairs, evicting the least recently used
// one when a new pair arrives at a full table.
//
// The bound is exact: a table of n entries holds n pairs before it evicts
// any, whatever the spread of keys over its shards. Each shard keeps its
// entries in use order (a doubly linked list threaded through a slice), so
// its least recently used entry is known exactly; a table small enough to
// need no sharding (up to 2·shardMin entries) has one shard and is an exact
// LRU. A larger table evicts the least recently used entry of the shard,
// among a few sampled, whose oldest entry was used longest ago: an entry
// used within the last second is evicted only if every sampled shard's
// oldest entry is that recent too, i.e. only when the whole table turns
// over within a second.
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
	none          = ^uint32(0) // null link
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

type shard struct {
	mu    sync.Mutex
	index map[uint64]uint32 // key → node
	nodes []node
	head  uint32 // most recently used
	tail  uint32 // least recently used
	free  uint32 // first free node, linked through next
	_     [24]byte
}

type node struct {
	key        uint64
	value      uint32
	seen       uint32 // unix seconds of the last use
	prev, next uint32
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
		s := &t.shards[i]
		s.index = make(map[uint64]uint32)
		s.head, s.tail, s.free = none, none, none
	}
	t.SetLimits(maxEntries, ttl)
	return t
}

// SetLimits changes the bound and the idle TTL of a table in use, as a
// reload does. Lowering the bound evicts least recently used entries down
// to it at once; raising it takes effect for the next insertions.
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
	i, ok := s.index[key]
	if !ok {
		s.mu.Unlock()
		return 0, false
	}
	n := &s.nodes[i]
	if t.expired(n.seen, sec) {
		s.remove(i)
		s.mu.Unlock()
		t.count.Add(-1)
		return 0, false
	}
	n.seen = sec
	v := n.value
	s.touch(i)
	s.mu.Unlock()
	return v, true
}

// Put sets key's target and marks it used. A new key at a full table first
// evicts the least recently used entry (see the package comment).
func (t *Table) Put(key uint64, value uint32, now int64) {
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
	i, ok := s.index[key]
	if !ok {
		return false
	}
	n := &s.nodes[i]
	n.value, n.seen = value, sec
	s.touch(i)
	return true
}

// evictOne removes the least recently used entry of the sampled shard whose
// least recently used entry is oldest. It reports false if the sampled
// shards, then all shards, are empty.
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
		if s.tail != none {
			if seen := s.nodes[s.tail].seen; best < 0 || seen < bestSeen {
				best, bestSeen = i, seen
			}
		}
		s.mu.Unlock()
	}
	if best < 0 {
		return false
	}
	s := &t.shards[best]
	s.mu.Lock()
	if s.tail == none { // emptied meanwhile
		s.mu.Unlock()
		return t.evictFrom(start, count)
	}
	s.remove(s.tail)
	s.mu.Unlock()
	t.count.Add(-1)
	return true
}

// Delete forgets key.
func (t *Table) Delete(key uint64) {
	s := t.shard(key)
	s.mu.Lock()
	i, ok := s.index[key]
	if ok {
		s.remove(i)
	}
	s.mu.Unlock()
	if ok {
		t.count.Add(-1)
	}
}

// DeleteValue forgets every pair pointing at value (a target that is gone)
// and returns how many it forgot.
func (t *Table) DeleteValue(value uint32) int {
	return t.removeIf(func(n *node) bool { return n.value == value })
}

// Clear forgets every pair.
func (t *Table) Clear() {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		removed += len(s.index)
		s.index = make(map[uint64]uint32)
		s.nodes = nil
		s.head, s.tail, s.free = none, none, none
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
		for j := s.head; j != none; j = s.nodes[j].next {
			if n := &s.nodes[j]; !t.expired(n.seen, sec) {
				out[n.value]++
			}
		}
		s.mu.Unlock()
	}
	return out
}

// Sweep removes every entry idle past the TTL and returns how many it
// removed. Get expires entries too; Sweep, run periodically, frees the
// memory of pairs that never come back. Entries are in use order, so it
// looks only at the expired ones (and one more per shard).
func (t *Table) Sweep(now int64) int {
	if t.ttl.Load() == 0 {
		return 0
	}
	sec, removed := seconds(now), 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for s.tail != none && t.expired(s.nodes[s.tail].seen, sec) {
			s.remove(s.tail)
			removed++
		}
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
	return removed
}

func (t *Table) removeIf(match func(*node) bool) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for j := s.head; j != none; {
			next := s.nodes[j].next
			if match(&s.nodes[j]) {
				s.remove(j)
				removed++
			}
			j = next
		}
		s.mu.Unlock()
	}
	t.count.Add(-int64(removed))
	return removed
}

// insert adds a new key at the front; s.mu is held.
func (s *shard) insert(key uint64, value, sec uint32) {
	i := s.free
	if i != none {
		s.free = s.nodes[i].next
	} else {
		i = uint32(len(s.nodes))
		s.nodes = append(s.nodes, node{})
	}
	s.nodes[i] = node{key: key, value: value, seen: sec, prev: none, next: s.head}
	if s.head != none {
		s.nodes[s.head].prev = i
	} else {
		s.tail = i
	}
	s.head = i
	s.index[key] = i
}

// touch moves node i to the front; s.mu is held.
func (s *shard) touch(i uint32) {
	if s.head == i {
		return
	}
	s.unlink(i)
	n := &s.nodes[i]
	n.prev, n.next = none, s.head
	s.nodes[s.head].prev = i
	s.head = i
	if s.tail == none {
		s.tail = i
	}
}

// remove unlinks node i, forgets its key and frees it; s.mu is held.
func (s *shard) remove(i uint32) {
	s.unlink(i)
	delete(s.index, s.nodes[i].key)
	s.nodes[i] = node{next: s.free}
	s.free = i
}

func (s *shard) unlink(i uint32) {
	n := &s.nodes[i]
	if n.prev != none {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next != none {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
}
