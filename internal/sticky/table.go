// Package sticky is a bounded affinity table: it remembers which target a
// (user, app) pair was sent to, forgets pairs idle longer than a TTL, and
// holds at most a fixed number of pairs, evicting one not used recently
// when a new pair arrives at a full table.
//
// The bound, the eviction (CLOCK across shards, one shard below 4096
// entries) and the idle expiry are internal/bounded's, shared with the
// rate limiter's peer tables; see that package. Keys are 64-bit hashes of
// the pair and values are target ids, so an entry costs a fixed few dozen
// bytes whatever the strings' length (BenchmarkStickyHit reports B/entry).
// Two pairs sharing a hash (odds about n²/2⁶⁵ for n entries) would share a
// target, which stickiness tolerates. Times are whole seconds: an entry's
// idle time is known to within one second.
package sticky

import (
	"hash/maphash"
	"time"

	"github.com/edgesteer/edgesteer/internal/bounded"
)

const (
	maxShards     = bounded.MaxShards
	secondsPerSec = int64(time.Second)
	// MaxValue is the largest value a table stores.
	MaxValue = 1<<31 - 1
	// A value is a target id (IDMask bits) and a 2-bit tag above it
	// (TagShift): the shared sticky level keeps there the epoch in which
	// the pair was last synced with the store. DeleteValue and Counts
	// look at the id alone.
	TagShift = 29
	IDMask   = 1<<TagShift - 1
)

// ID is the target id of a stored value.
func ID(v uint32) uint32 { return v & IDMask }

// Tag is the tag of a stored value.
func Tag(v uint32) uint32 { return v >> TagShift & 3 }

// Tagged makes a value of a target id and a tag (0-3).
func Tagged(id, tag uint32) uint32 { return id&IDMask | (tag&3)<<TagShift }

// Table maps pair hashes to target ids. It is safe for concurrent use.
type Table struct {
	seed maphash.Seed
	t    *bounded.Table[uint32]
}

// New returns a table holding at most maxEntries pairs (at least 1), each
// forgotten after ttl without use (0: never; below a second counts as a
// second).
func New(maxEntries int, ttl time.Duration) *Table {
	t := &Table{seed: maphash.MakeSeed(), t: bounded.New[uint32](maxEntries)}
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
	t.t.SetLimits(maxEntries, sec)
}

// Max returns the bound.
func (t *Table) Max() int { return t.t.Max() }

// Shards returns the number of shards (fixed when the table is made).
func (t *Table) Shards() int { return t.t.Shards() }

// Key hashes a (user, app) pair. ("ab", "c") and ("a", "bc") differ.
func (t *Table) Key(user, app string) uint64 {
	h := maphash.String(t.seed, user)
	return (h^(h>>29))*0x9E3779B97F4A7C15 ^ maphash.String(t.seed, app)
}

func seconds(now int64) uint32 { return uint32(now / secondsPerSec) }

// Get returns the target for key and marks it used at now (unix ns). An
// entry idle past the TTL is removed and reported missing.
func (t *Table) Get(key uint64, now int64) (uint32, bool) { return t.t.Get(key, seconds(now)) }

// Put sets key's target (at most MaxValue) and marks it used. A new key at
// a full table first evicts an entry.
func (t *Table) Put(key uint64, value uint32, now int64) {
	if value > MaxValue {
		panic("sticky: value out of range")
	}
	t.t.Put(key, value, seconds(now))
}

// Delete forgets key.
func (t *Table) Delete(key uint64) { t.t.Delete(key) }

// DeleteValue forgets every pair pointing at target id value (a target
// that is gone), whatever its tag, and returns how many it forgot.
func (t *Table) DeleteValue(value uint32) int {
	return t.t.RemoveIf(func(v uint32, _ uint32) bool { return ID(v) == value })
}

// Clear forgets every pair.
func (t *Table) Clear() { t.t.Clear() }

// Len returns the number of entries, expired ones not yet swept included.
func (t *Table) Len() int { return t.t.Len() }

// Counts returns how many live entries point at each target id.
func (t *Table) Counts(now int64) map[uint32]int {
	out := map[uint32]int{}
	t.t.Each(seconds(now), func(v uint32) { out[ID(v)]++ })
	return out
}

// Sweep removes every entry idle past the TTL and returns how many it
// removed. Get expires entries too; Sweep, run periodically, frees the
// memory of pairs that never come back.
func (t *Table) Sweep(now int64) int { return t.t.Sweep(seconds(now)) }
