package gatewayorder

import (
	"slices"
	"testing"
	"time"
)

// The worked example: gw1 302, gw2 132, gw3 506, gw4 877 ms.
func TestOrderWorkedExample(t *testing.T) {
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

// Unprobed backups come after their gateway, when it is first, exactly where
// its backup list names them; a probed backup that did not answer comes
// later, by the rule; another first choice's list does not bring them.
func TestTargetsPlaceUnprobedBackups(t *testing.T) {
	bk := Gateway{Name: "bk1", Addr: "192.0.2.9:443"}
	gws := []Gateway{{Name: "gw1"}, {Name: "gw2", Backups: []string{"gw4", "bk1", "gw3"}, Unprobed: []Gateway{bk}}, {Name: "gw3"}, {Name: "gw4"}}
	targets := func(rtts ...time.Duration) []string {
		var out []string
		for _, g := range Targets(&Result{Gateways: gws, Order: Order(gws, rtts, false), RTTs: rtts}) {
			out = append(out, g.Name)
		}
		return out
	}
	if got := targets(302*ms, 132*ms, 0, 877*ms); !slices.Equal(got, []string{"gw2", "gw4", "bk1", "gw1", "gw3"}) {
		t.Fatalf("gw2 first, gw3 unanswered: %v", got)
	}
	if got := targets(302*ms, 132*ms, 506*ms, 877*ms); !slices.Equal(got, []string{"gw2", "gw4", "bk1", "gw3", "gw1"}) {
		t.Fatalf("gw2 first, all answered: %v", got)
	}
	if got := targets(100*ms, 132*ms, 506*ms, 877*ms); !slices.Equal(got, []string{"gw1", "gw2", "gw3", "gw4"}) {
		t.Fatalf("gw1 first: %v", got)
	}
}

const ms = time.Millisecond

func names(gws []Gateway, order []int) []string {
	out := make([]string, len(order))
	for i, j := range order {
		out[i] = gws[j].Name
	}
	return out
}

// One rule, every case: optimal, its backups that answered, the others that
// answered by RTT, then those that did not (config order; omitted with omit).
func TestOrderOneRule(t *testing.T) {
	gws := []Gateway{{Name: "a", Backups: []string{"c", "b"}}, {Name: "b"}, {Name: "c", Backups: []string{"d"}}, {Name: "d"}}
	for _, tc := range []struct {
		name       string
		rtts       []time.Duration // a b c d
		last, omit []string
	}{
		{"all answered", []time.Duration{10, 40, 30, 20}, []string{"a", "c", "b", "d"}, []string{"a", "c", "b", "d"}},
		{"dead backup", []time.Duration{10, 40, 0, 20}, []string{"a", "b", "d", "c"}, []string{"a", "b", "d"}},
		{"all backups dead", []time.Duration{10, 0, 0, 20}, []string{"a", "d", "b", "c"}, []string{"a", "d"}},
		{"dead optimal: the next best leads with its own backups", []time.Duration{0, 40, 20, 30}, []string{"c", "d", "b", "a"}, []string{"c", "d", "b"}},
		{"only one answered", []time.Duration{0, 0, 0, 20}, []string{"d", "a", "b", "c"}, []string{"d"}},
		{"all dead: configured order, even with omit", []time.Duration{0, 0, 0, 0}, []string{"a", "b", "c", "d"}, []string{"a", "b", "c", "d"}},
		{"tie: config order", []time.Duration{0, 20, 0, 20}, []string{"b", "d", "a", "c"}, []string{"b", "d"}},
	} {
		if got := names(gws, Order(gws, tc.rtts, false)); !slices.Equal(got, tc.last) {
			t.Errorf("%s, unmeasured last: %v, want %v", tc.name, got, tc.last)
		}
		if got := names(gws, Order(gws, tc.rtts, true)); !slices.Equal(got, tc.omit) {
			t.Errorf("%s, unmeasured omit: %v, want %v", tc.name, got, tc.omit)
		}
	}
}
