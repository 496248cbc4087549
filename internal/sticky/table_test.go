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

// Each shard holds max/64 entries; a full shard evicts an old entry, never
// one just used, and never grows.
func TestBoundedEviction(t *testing.T) {
	sec := int64(time.Second)
	tb := New(64*5, 0)
	key := func(i uint64) uint64 { return 5<<58 | i } // all in shard 5
	for i := range uint64(5) {
		tb.Put(key(i), uint32(i), 0)
	}
	for i := uint64(1); i < 5; i++ {
		tb.Get(key(i), 10*sec) // all but 0 used recently
	}
	tb.Put(key(5), 5, 11*sec)
	if _, ok := tb.Get(key(0), 12*sec); ok {
		t.Fatal("the least recently used entry survived eviction")
	}
	for _, i := range []uint64{1, 2, 3, 4, 5} {
		if v, ok := tb.Get(key(i), 13*sec); !ok || v != uint32(i) {
			t.Fatalf("entry %d lost", i)
		}
	}
	// A flood of distinct keys never grows the table past its bound.
	for i := range uint64(100000) {
		tb.Put(i*0x9E3779B97F4A7C15, 1, 20*sec)
	}
	if n := tb.Len(); n > 64*5 {
		t.Fatalf("table holds %d entries, bound %d", n, 64*5)
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
// table's heap bytes per entry.
func BenchmarkStickyHit(b *testing.B) {
	const n = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := New(n+n/4, time.Hour) // headroom: shards fill unevenly
	keys := make([]uint64, 0, 4096)
	for i := range n {
		k := tb.Key("10.0."+strconv.Itoa(i>>8)+"."+strconv.Itoa(i&255), "app"+strconv.Itoa(i%7))
		tb.Put(k, uint32(i%4), 0)
		if i%256 == 0 {
			keys = append(keys, k)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	bytesPerEntry := float64(after.HeapAlloc-before.HeapAlloc-uint64(cap(keys)*8)) / float64(tb.Len())
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := tb.Get(keys[i%len(keys)], 1); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
	b.ReportMetric(bytesPerEntry, "B/entry")
}
