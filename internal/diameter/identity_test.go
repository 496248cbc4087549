package diameter

import "testing"

func TestLookupFold(t *testing.T) {
	m := map[string]int{"pcrf1.example": 1}
	for key, want := range map[string]bool{"pcrf1.example": true, "PCRF1.Example": true, "pcrf2.example": false, "PCRF2.example": false} {
		if v, ok := LookupFold(m, []byte(key)); ok != want || (ok && v != 1) {
			t.Errorf("%s: %d %v, want found %v", key, v, ok, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { LookupFold(m, []byte("PCRF1.example")) }); n != 0 {
		t.Errorf("%.0f allocations", n)
	}
}
