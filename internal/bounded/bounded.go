// Package bounded holds the eviction rule shared by the tables keyed by
// client-controlled values (sticky pairs, rate-limit peers): when a table is
// full, drop the least recently used of a few sampled entries, as Redis's
// approximate LRU does. Map iteration starts at a random entry, so the
// sample is random; the cost is constant however large the table.
package bounded

// Samples is how many entries one eviction looks at.
const Samples = 5

// EvictOldest deletes, among Samples entries of m, the one whose lastUsed
// is smallest. m must not be empty.
func EvictOldest[K comparable, V any](m map[K]V, lastUsed func(V) int64) {
	var victim K
	var oldest int64
	n := 0
	for k, v := range m {
		if t := lastUsed(v); n == 0 || t < oldest {
			victim, oldest = k, t
		}
		if n++; n == Samples {
			break
		}
	}
	delete(m, victim)
}
