package rttreports

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The bounds are checked as they will apply, defaults included: max_reporters
// 2 alone is refused (min_reporters defaults to 3, and no location could
// ever answer from reports), naming both options.
func TestReportConfigValidateWithDefaults(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxReporters: 2}, "min_reporters 3 (the default): above max_reporters 2"},
		{Config{MinReporters: 40}, "min_reporters 40: above max_reporters 32 (the default)"},
		{Config{MinReporters: 5, MaxReporters: 4}, "min_reporters 5: above max_reporters 4"},
		{Config{MaxTokenReporters: -1}, "max_reporters_per_token -1"},
		{Config{MinReporters: 2, MaxReporters: 2}, ""},
		{Config{}, ""},
	} {
		err := c.cfg.Validate()
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// One token reporting from many networks of one location (an IPv6 client
// rotating its /64 inside a /56) counts at most MaxTokenReporters there and,
// in a full location, pushes out its own reporters, never the honest
// reporters of other tokens: they keep the order.
func TestTokenCannotEvictHonestReporters(t *testing.T) {
	for _, maxReporters := range []int{8, 32} {
		r := newReports(Config{MaxReporters: maxReporters, MinReporters: 3})
		loc := "2001:db8:0:100::/56"
		for i := range 5 {
			now := t0.Add(time.Duration(i) * time.Second)
			mustAdd(t, r, loc, fmt.Sprintf("honest%d|2001:db8:0:1%02x::/64", i, i), rep(now, "gw1", 300*ms, "gw2", 130*ms), now)
		}
		for i := range 200 {
			now := t0.Add(time.Minute + time.Duration(i)*time.Second)
			mustAdd(t, r, loc, fmt.Sprintf("liar|2001:db8:0:1%02x::/64", i), rep(now, "gw1", ms, "gw2", 900*ms), now)
		}
		now := t0.Add(10 * time.Minute)
		liars, honest := 0, 0
		for k := range r.locs[loc].reporters {
			if ReporterToken(k) == "liar" {
				liars++
			} else {
				honest++
			}
		}
		want := min(DefaultMaxTokenReporters, maxReporters-5) // a full location: the liar's own go
		if liars != want || honest != 5 {
			t.Fatalf("max_reporters %d: %d liar and %d honest reporters, want %d and 5", maxReporters, liars, honest, want)
		}
		if got, n := orderNames(t, r, loc, now); n != 5+want || got[0] != "gw2" {
			t.Fatalf("max_reporters %d: order %v from %d reporters, want gw2 first from %d", maxReporters, got, n, 5+want)
		}
	}
	// Within its bound a token's reporters all count (an office sharing one).
	r := newReports(Config{MaxTokenReporters: 2})
	for i := range 3 {
		mustAdd(t, r, "l", fmt.Sprintf("office|10.0.0.%d/32", i), rep(t0, "gw1", ms), t0)
	}
	if n := len(r.locs["l"].reporters); n != 2 {
		t.Fatalf("max_reporters_per_token 2: %d reporters of one token", n)
	}
}

// An even count of votes takes the mean of the middle two, and a failure
// among the middle two makes the median a failure: the gateway is then
// unmeasured (omitted under unmeasured omit), not measured at ~146 years.
func TestMedianEvenCount(t *testing.T) {
	fail := time.Duration(math.MaxInt64)
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{[]time.Duration{40, 10, 30, 20}, 25},
		{[]time.Duration{10, fail}, fail},
		{[]time.Duration{fail, 10, 20, fail}, fail},
		{[]time.Duration{10, 20, 30, fail}, 25},
	} {
		if got := Median(slices.Clone(c.in)); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	r := NewReports()
	r.Configure(Config{Enabled: true, Probe: "https", MinReporters: 2}, exampleGateways(), true)
	for i, gw1 := range []any{10 * ms, 20 * ms, 30 * ms, 40 * ms} {
		gw3 := any(5 * ms)
		if i < 2 {
			gw3 = "fail"
		}
		mustAdd(t, r, "l", fmt.Sprintf("r%d|10.0.0.%d/32", i, i), rep(t0, "gw1", gw1, "gw2", 22*ms, "gw3", gw3), t0)
	}
	// gw1 25 ms (not the lower middle's 20), gw2 22 ms, gw3 a failure: omitted.
	if got, _ := orderNames(t, r, "l", t0); !slices.Equal(got, []string{"gw2", "gw1"}) {
		t.Fatalf("order %v, want [gw2 gw1] (gw3's median a failure, omitted)", got)
	}
}
