package ntier

import (
	"strconv"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// Assign returns, for each of the buckets, the index of the node it goes
// to: bucket b's documented node is b mod len(names); while that node is
// down (up[i] false) b goes to the first live node in rendezvous order of
// (b, names). With no node up, every bucket keeps its documented node.
func Assign(names []string, up []bool, buckets int) []int {
	out := make([]int, buckets)
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	live := 0
	for _, u := range up {
		if u {
			live++
		}
	}
	for b := range out {
		home := b % len(names)
		out[b] = home
		if up[home] || live == 0 {
			continue
		}
		for _, n := range placement.Rank(strconv.Itoa(b), names) {
			if i := index[n]; up[i] {
				out[b] = i
				break
			}
		}
	}
	return out
}
