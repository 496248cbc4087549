package bounded

import (
	"hash/maphash"
	"strconv"
	"testing"
)

func hashOf(seed maphash.Seed, s string) uint64 { return maphash.String(seed, s) }

// A flood of new keys used in one second (so every eviction candidate
// ties) keeps the shards even and the bound exact, and a key used between
// every 1 000 new ones — a fifth of the table — is never evicted.
func TestFloodKeepsShardsEvenAndKeyInUse(t *testing.T) {
	seed := maphash.MakeSeed()
	const n = 5000
	tb := New[int](n)
	if tb.Shards() < 2 {
		t.Fatalf("%d shards", tb.Shards())
	}
	active := hashOf(seed, "active")
	tb.Put(active, -1, 0)
	for i := range 100_000 {
		tb.GetOrPut(hashOf(seed, strconv.Itoa(i)), 0, func() int { return i })
		if i%1000 == 0 {
			if v, ok := tb.Get(active, 0); !ok || v != -1 {
				t.Fatalf("after %d new keys the key in use was evicted", i)
			}
		}
	}
	if tb.Len() != n {
		t.Fatalf("holds %d, bound %d", tb.Len(), n)
	}
	per := n / tb.Shards()
	for i := range tb.shards {
		if l := len(tb.shards[i].index); l < per*9/10 || l > per*11/10 {
			t.Errorf("shard %d holds %d, want about %d", i, l, per)
		}
	}
}
