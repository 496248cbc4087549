package quota

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A peer's store trouble holds, with its Since, for as long as the store
// refuses its keys, and ends only when the store takes them: not when an
// interval without its traffic leaves its keys out of a sync, nor when
// its counts are withheld at the fallback share (a refused write would
// otherwise never be asked again), nor across a sync that failed as a
// whole. (Otherwise the trouble would end at the first sync without the
// peer's traffic, or at every other sync when only writes are refused,
// and the log would say "refused" and "answering again" in turn.)
func TestTroubleHoldsWhileRefused(t *testing.T) {
	const limit = 300.0
	noperm := func(key string) error {
		if strings.HasPrefix(key, "{p:bad}") {
			return Reply("NOPERM No permissions to access a key")
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		deny func(s *FakeStore, f func(string) error)
		down bool
	}{
		{"reads and writes refused", (*FakeStore).SetDeny, false},
		{"writes refused", (*FakeStore).SetDenyWrite, false},
		{"refused, then the store down", (*FakeStore).SetDeny, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, []string{"bad"}, Config{Prefix: "p", Limit: limit})
			on := true
			demand := func(rep, _ int) float64 {
				if on && rep == 0 {
					return 2 * limit
				}
				return 0
			}
			c.run(time.Second, demand)
			tc.deny(c.store, noperm)
			c.run(500*time.Millisecond, demand)
			first := c.reps[0].Troubles(0)
			if len(first) != 1 || first[0].Peer != "bad" || first[0].Reason != "noperm" {
				t.Fatalf("troubles %+v, want bad refused (noperm)", first)
			}
			// Traffic on and off, one sync apart and more.
			for i, traffic := range []bool{false, false, true, false, true, true, false, false, false, false, true} {
				on = traffic
				if tc.down && i == 4 {
					c.store.SetDown(Reply("LOADING Redis is loading the dataset in memory"))
				}
				if tc.down && i == 6 {
					c.store.SetDown(nil)
				}
				c.run(250*time.Millisecond, demand)
				st, tr := c.reps[0].State(), c.reps[0].Troubles(0)
				if len(tr) != 1 || tr[0].Since != first[0].Since || st.FallbackPeers != 1 || st.Healthy {
					t.Fatalf("interval %d (traffic %v): troubles %+v, state %+v; want bad's trouble since %v kept",
						i, traffic, tr, st, first[0].Since)
				}
				s, _ := c.reps[0].Share("bad")
				near(t, fmt.Sprintf("interval %d: bad's share", i), s, limit/2, 1e-9)
			}
			tc.deny(c.store, nil)
			on = true
			c.run(time.Second, demand)
			if st, tr := c.reps[0].State(), c.reps[0].Troubles(0); len(tr) != 0 || !st.Healthy || st.FallbackPeers != 0 {
				t.Errorf("with the keys allowed again: troubles %+v, state %+v", tr, st)
			}
		})
	}
}
