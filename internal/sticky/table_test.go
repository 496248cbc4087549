package sticky

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestPutGetAndKeyPairs(t *testing.T) {
	tb := New(1000, 0)
	a, b := tb.Key("ab", "c"), tb.Key("a", "bc")
	if a == b {
		t.Fatal("(ab,c) and (a,bc) hash alike")
	}
	// A pair is user and app: one user on two apps is two keys, and so is
	// one app for two users.
	if tb.Key("alice", "jira") == tb.Key("alice", "sql") || tb.Key("alice", "jira") == tb.Key("bob", "jira") {
		t.Fatal("the key ignores the user or the app")
	}
	tb.Put(a, 7, 1)
	if v, ok := tb.Get(a, 2); !ok || v != 7 {
		t.Fatalf("Get = %d, %v", v, ok)
	}
	if _, ok := tb.Get(b, 2); ok {
		t.Fatal("unknown key found")
	}
	tb.Put(a, 9, 3)
	if v, _ := tb.Get(a, 4); v != 9 || tb.Len() != 1 {
		t.Fatalf("overwrite: %d, len %d", v, tb.Len())
	}
	tb.Delete(a)
	if _, ok := tb.Get(a, 5); ok || tb.Len() != 0 {
		t.Fatal("deleted key still there")
	}
}

func TestIdleTTL(t *testing.T) {
	ttl := time.Minute
	tb := New(100, ttl)
	k := tb.Key("u", "app")
	tb.Put(k, 1, 0)
	if _, ok := tb.Get(k, int64(ttl)); !ok {
		t.Fatal("expired at exactly the TTL")
	}
	// The Get above refreshed it: still there one TTL later.
	if _, ok := tb.Get(k, 2*int64(ttl)); !ok {
		t.Fatal("a used entry expired")
	}
	if _, ok := tb.Get(k, 3*int64(ttl)+int64(time.Second)); ok {
		t.Fatal("an idle entry outlived its TTL")
	}
	if tb.Len() != 0 {
		t.Fatal("expired entry not removed")
	}
	for i := range 10 {
		tb.Put(uint64(i)<<58|uint64(i), 1, int64(i)*int64(time.Second))
	}
	if n := tb.Sweep(int64(ttl) + 5*int64(time.Second)); n != 5 || tb.Len() != 5 {
		t.Fatalf("Sweep removed %d, %d left; want 5 and 5", n, tb.Len())
	}
}

// The bound is exact: a table of 100 (one shard) and one of 100,000 (many
// shards) each hold exactly that many pairs before evicting, and never more.
func TestExactBound(t *testing.T) {
	for _, n := range []int{1, 100, 5000, 100_000} {
		tb := New(n, 0)
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = tb.Key(strconv.Itoa(i), "app")
			tb.Put(keys[i], uint32(i), 0)
		}
		if tb.Len() != n {
			t.Fatalf("max %d (%d shards): holds %d after %d puts", n, tb.Shards(), tb.Len(), n)
		}
		for i, k := range keys {
			if v, ok := tb.Get(k, 0); !ok || v != uint32(i) {
				t.Fatalf("max %d: pair %d evicted before the table was full", n, i)
			}
		}
		tb.Put(tb.Key("one", "more"), 1, 0)
		if tb.Len() != n {
			t.Fatalf("max %d: holds %d after one more", n, tb.Len())
		}
	}
	if New(100, 0).Shards() != 1 || New(100_000, 0).Shards() < 16 || New(1<<22, 0).Shards() != maxShards {
		t.Fatal("shard counts: want one for small tables, more for large ones")
	}
}

// A small table is an exact LRU: a flood of new keys evicts the least
// recently used, never an entry in use, even when everything happens
// within one second.
func TestFloodEvictsLeastRecentlyUsedSmall(t *testing.T) {
	tb := New(100, time.Hour)
	active := make([]uint64, 50)
	for i := range active {
		active[i] = tb.Key("active", strconv.Itoa(i))
		tb.Put(active[i], uint32(i), 0)
	}
	for i := range 10_000 {
		tb.Put(tb.Key("flood", strconv.Itoa(i)), 7, 0)
		if i%40 == 0 { // the active pairs are used every 40 new keys
			for j, k := range active {
				if v, ok := tb.Get(k, 0); !ok || v != uint32(j) {
					t.Fatalf("after %d new keys an active pair was evicted", i)
				}
			}
		}
		if tb.Len() > 100 {
			t.Fatalf("holds %d", tb.Len())
		}
	}
	// The last flood keys are the most recent; the oldest flood keys went.
	if _, ok := tb.Get(tb.Key("flood", "9999"), 0); !ok {
		t.Fatal("the newest key was evicted")
	}
	if _, ok := tb.Get(tb.Key("flood", "0"), 0); ok {
		t.Fatal("the oldest flood key survived")
	}
}

// A sharded table evicts across shards: after a flood of exactly as many
// new pairs as there are idle ones, every pair in use is still there, even
// though the flood and the idle pairs are spread unevenly over the shards
// (evicting in the new pair's own shard, or in any one shard, would take
// pairs in use from the shards whose idle pairs ran out first).
func TestFloodEvictsAcrossShards(t *testing.T) {
	sec := int64(time.Second)
	const n = 12000
	tb := New(n, time.Hour)
	if tb.Shards() != 4 {
		t.Fatalf("%d shards, want 4 (all compared by an eviction)", tb.Shards())
	}
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = tb.Key(strconv.Itoa(i), "app")
		tb.Put(keys[i], 1, 0)
	}
	for _, k := range keys[:n/2] { // half of them in use later
		tb.Get(k, 10*sec)
	}
	for i := range n / 2 {
		tb.Put(tb.Key("flood", strconv.Itoa(i)), 2, 20*sec)
	}
	if tb.Len() != n {
		t.Fatalf("holds %d", tb.Len())
	}
	for i, k := range keys[:n/2] {
		if _, ok := tb.Get(k, 21*sec); !ok {
			t.Fatalf("pair %d, in use, evicted while idle pairs remained", i)
		}
	}
	for i, k := range keys[n/2:] {
		if _, ok := tb.Get(k, 21*sec); ok {
			t.Fatalf("idle pair %d survived the flood", n/2+i)
		}
	}
}

// Lowering the bound of a table in use (a reload) evicts the least
// recently used down to it; DeleteValue and Clear forget pairs.
func TestSetLimitsDeleteValueClear(t *testing.T) {
	tb := New(100, 0)
	for i := range 100 {
		tb.Put(tb.Key(strconv.Itoa(i), ""), uint32(i%4), int64(i)*int64(time.Second))
	}
	tb.SetLimits(10, time.Minute)
	if tb.Len() != 10 || tb.Max() != 10 {
		t.Fatalf("after shrinking: %d entries, max %d", tb.Len(), tb.Max())
	}
	for i := 90; i < 100; i++ {
		if _, ok := tb.Get(tb.Key(strconv.Itoa(i), ""), 100*int64(time.Second)); !ok {
			t.Fatalf("recent pair %d evicted by the shrink", i)
		}
	}
	if n := tb.DeleteValue(1); n != 2 || tb.Len() != 8 { // pairs 93 and 97
		t.Fatalf("DeleteValue removed %d, %d left", n, tb.Len())
	}
	if c := tb.Counts(100 * int64(time.Second)); c[1] != 0 || c[0]+c[2]+c[3] != 8 {
		t.Fatalf("counts %v", c)
	}
	tb.Clear()
	tb.Put(1, 1, 0)
	if tb.Len() != 1 {
		t.Fatalf("after Clear and one Put: %d", tb.Len())
	}
}

func TestCountsPerTarget(t *testing.T) {
	tb := New(1000, time.Second)
	for i, v := range []uint32{1, 1, 2, 3, 3, 3} { // all used at time 0
		tb.Put(tb.Key(string(rune('a'+i)), "x"), v, 0)
	}
	c := tb.Counts(0)
	if c[1] != 2 || c[2] != 1 || c[3] != 3 {
		t.Fatalf("counts %v", c)
	}
	if c := tb.Counts(int64(3 * time.Second)); len(c) != 0 {
		t.Fatalf("expired entries counted: %v", c)
	}
}

func TestConcurrentUse(t *testing.T) {
	tb := New(1000, time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				k := tb.Key(string(rune(g)), string(rune(i%300)))
				if _, ok := tb.Get(k, int64(i)); !ok {
					tb.Put(k, uint32(g), int64(i))
				}
			}
		}()
	}
	wg.Wait()
	if tb.Len() > 1000 {
		t.Fatalf("len %d over bound", tb.Len())
	}
}

// BenchmarkStickyHit is a hit in a table of 1M entries; it reports the
// table's heap bytes per entry. Every Get must find its key with the value
// put for it (the sampled keys' values cycle through all four).
func BenchmarkStickyHit(b *testing.B) {
	const n = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := New(n+n/4, time.Hour) // room to spare: nothing is evicted while filling
	keys := make([]uint64, 0, 4096)
	vals := make([]uint32, 0, cap(keys))
	for i := range n {
		k := tb.Key("10.0."+strconv.Itoa(i>>8)+"."+strconv.Itoa(i&255), "app"+strconv.Itoa(i%7))
		tb.Put(k, uint32(i%4), 0)
		if i%257 == 0 { // 257 ≡ 1 (mod 4): the sampled values differ
			keys = append(keys, k)
			vals = append(vals, uint32(i%4))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	bytesPerEntry := float64(after.HeapAlloc-before.HeapAlloc-uint64(cap(keys)*8+cap(vals)*4)) / float64(tb.Len())
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if v, ok := tb.Get(keys[i%len(keys)], 1); !ok || v != vals[i%len(keys)] {
				b.Errorf("key %d: %d, %v; want a hit with %d", i%len(keys), v, ok, vals[i%len(keys)])
				return // Fatal is only for the benchmark's own goroutine
			}
			i++
		}
	})
	b.ReportMetric(bytesPerEntry, "B/entry")
}

// Tagged values keep their id for DeleteValue and Counts.
func TestTaggedValues(t *testing.T) {
	tb := New(10, time.Hour)
	tb.Put(1, Tagged(7, 0), 0)
	tb.Put(2, Tagged(7, 3), 0)
	tb.Put(3, Tagged(8, 2), 0)
	if v, _ := tb.Get(2, 0); ID(v) != 7 || Tag(v) != 3 {
		t.Fatalf("value %x: id %d tag %d", v, ID(v), Tag(v))
	}
	if c := tb.Counts(0); c[7] != 2 || c[8] != 1 || len(c) != 2 {
		t.Fatalf("counts %v", c)
	}
	if n := tb.DeleteValue(7); n != 2 || tb.Len() != 1 {
		t.Fatalf("DeleteValue(7) removed %d", n)
	}
	if Tagged(IDMask, 3) > MaxValue {
		t.Fatal("a tagged value exceeds MaxValue")
	}
}
