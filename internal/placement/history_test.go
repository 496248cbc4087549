package placement

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The history keeps the last HistoryLength changes, oldest first.
func TestHistoryIsBounded(t *testing.T) {
	now := time.Now()
	p := autoPlacer(t, 4, 1, &Auto{TargetPerNode: 1, CoolDown: time.Second}, 0)
	for i := range 60 { // each tenant: grows 1 → 2 at its 2nd connection, shrinks back
		tenant := fmt.Sprint("t", i)
		ls := append(arrive(t, p, tenant, 1, true, now), arrive(t, p, tenant, 1, true, now)...)
		for _, l := range ls {
			l.Release(now)
		}
		p.Tick(now.Add(time.Millisecond))
		now = now.Add(2 * time.Second)
		p.Tick(now)
	}
	h := p.History()
	if len(h) != HistoryLength {
		t.Fatalf("%d changes held", len(h))
	}
	first, last := h[0], h[len(h)-1]
	if first.Tenant != "t10" || !first.Grew || first.From != 1 || first.To != 2 {
		t.Fatalf("oldest %+v", first)
	}
	if last.Tenant != "t59" || last.Grew || last.From != 2 || last.To != 1 || !strings.Contains(last.Reason, "cool_down") {
		t.Fatalf("newest %+v", last)
	}
	for i := 1; i < len(h); i++ {
		if h[i].Time.Before(h[i-1].Time) {
			t.Fatalf("out of order at %d", i)
		}
	}
}
