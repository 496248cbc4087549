package e2e

import "testing"

// FreePort never returns one port twice in a process, and stays out of the
// kernel's ephemeral range and the portrange tests' source ports. With the
// kernel's own choice of port, 300 calls repeat one about four times in
// five (birthday odds over ~28,000 ephemeral ports).
func TestFreePortNeverRepeats(t *testing.T) {
	lo, hi := freeRange()
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if hi > lo && (p < lo || p >= hi) {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
	}
}
