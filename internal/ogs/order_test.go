package ogs

import (
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

func names(gws []Gateway, order []int) []string {
	out := make([]string, len(order))
	for i, j := range order {
		out[i] = gws[j].Name
	}
	return out
}

// The seed's "OGS Selection Results": gw1 302, gw2 132, gw3 506, gw4 877 ms.
func TestOrderSeedResults(t *testing.T) {
	gws := []Gateway{{Name: "gw1"}, {Name: "gw2"}, {Name: "gw3"}, {Name: "gw4"}}
	rtts := []time.Duration{302 * ms, 132 * ms, 506 * ms, 877 * ms}
	if got := names(gws, Order(gws, rtts, false)); !slices.Equal(got, []string{"gw2", "gw1", "gw3", "gw4"}) {
		t.Fatalf("order %v", got)
	}
	// gw2's backup list comes right after it, then the rest by RTT.
	gws[1].Backups = []string{"gw4", "gw2", "nope"}
	if got := names(gws, Order(gws, rtts, false)); !slices.Equal(got, []string{"gw2", "gw4", "gw1", "gw3"}) {
		t.Fatalf("order with backups %v", got)
	}
}

func TestOrderUnmeasured(t *testing.T) {
	gws := []Gateway{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	rtts := []time.Duration{0, 50 * ms, 0}
	if got := names(gws, Order(gws, rtts, false)); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Fatalf("unmeasured last: %v", got)
	}
	if got := names(gws, Order(gws, rtts, true)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("unmeasured omitted: %v", got)
	}
	if got := names(gws, Order(gws, []time.Duration{0, 0, 0}, true)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("nothing measured: %v", got)
	}
}
