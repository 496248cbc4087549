package ratelimit

import (
	"hash/maphash"
	"time"

	"github.com/edgesteer/edgesteer/internal/bounded"
)

// Table holds one Bucket per key (a peer, a peer and message type), for
// keys that clients control. It is an internal/bounded table: it holds
// exactly its bound of keys, and when full it drops one not used recently
// (CLOCK, close to least-recently-used at every size: one shard below 4096
// keys, and across shards above). So a peer in use keeps its bucket while
// other keys come and go, unless more keys than the bound arrive between
// two of its uses. A dropped bucket that had refilled loses nothing; only
// under a flood of more live keys than the bound does a key restart with a
// full burst. Keys are stored as 64-bit hashes (two keys sharing one would
// share a bucket; odds ~n²/2⁶⁵).
type Table struct {
	seed maphash.Seed
	t    *bounded.Table[*Bucket]
}

// NewTable returns a table of at most size buckets (at least 1).
func NewTable(size int) *Table {
	return &Table{seed: maphash.MakeSeed(), t: bounded.New[*Bucket](size)}
}

// SetSize changes the bound to size buckets, as a reload that changes
// max_peers does: a lowered bound evicts at once (in eviction order, as
// when full), a raised one only lets the table grow. (The number of
// shards stays as the table was made.)
func (t *Table) SetSize(size int) { t.t.SetLimits(size, 0) }

func seconds(ns int64) uint32 { return uint32(ns / int64(time.Second)) }

func newBucket() *Bucket { return new(Bucket) }

// Bucket returns key's bucket, creating it if needed, and marks it used
// at now.
func (t *Table) Bucket(key string, now int64) *Bucket {
	return t.t.GetOrPut(maphash.String(t.seed, key), seconds(now), newBucket)
}

// Rescale multiplies every bucket's debt at now (tat − now, where
// positive) by factor: a reload that changes a rate from r to r' keeps the
// number of admissions each key has outstanding with factor r/r'.
func (t *Table) Rescale(factor float64, now int64) {
	t.t.Each(seconds(now), func(b *Bucket) { b.Rescale(factor, now) })
}

// Len returns the number of buckets.
func (t *Table) Len() int { return t.t.Len() }

// Sweep drops buckets unused since before idleBefore (to the second)
// whose GCRA state has refilled (tat ≤ now), and returns how many it
// dropped.
func (t *Table) Sweep(idleBefore, now int64) int {
	idle := seconds(idleBefore)
	return t.t.RemoveIf(func(b *Bucket, seen uint32) bool { return seen < idle && b.tat.Load() <= now })
}
