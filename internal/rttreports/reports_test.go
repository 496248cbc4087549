package rttreports

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newReports(cfg Config) *Reports {
	cfg.Enabled = true
	r := NewReports()
	r.Configure(cfg, exampleGateways(), false)
	return r
}

func rep(at time.Time, kv ...any) Report {
	out := Report{Probe: "https", At: at}
	for i := 0; i < len(kv); i += 2 {
		m := Measurement{Gateway: kv[i].(string)}
		switch v := kv[i+1].(type) {
		case time.Duration:
			m.RTT = v
		case string: // "fail"
			m.Failed = true
		}
		out.Measurements = append(out.Measurements, m)
	}
	return out
}

func mustAdd(t *testing.T, r *Reports, loc, who string, p Report, now time.Time) {
	t.Helper()
	if err := r.Add(loc, who, p, now); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
}

func orderNames(t *testing.T, r *Reports, loc string, now time.Time) ([]string, int) {
	t.Helper()
	res, n, ok := r.Order(loc, now)
	if !ok {
		return nil, n
	}
	return res.Names(), n
}

func TestReportRefusals(t *testing.T) {
	r := newReports(Config{Probe: "https"})
	for _, c := range []struct {
		rep    Report
		reason string
	}{
		{rep(t0, "gw9", 10*ms), "unknown_gateway"},
		{rep(t0, "gw1", time.Duration(0)), "rtt_out_of_range"},
		{rep(t0, "gw1", -ms), "rtt_out_of_range"},
		{rep(t0, "gw1", time.Hour), "rtt_out_of_range"},
		{rep(t0.Add(ClockSkew+time.Second), "gw1", 10*ms), "future"},
		{rep(t0.Add(-DefaultWindow), "gw1", 10*ms), "stale"},
		{rep(t0, "gw1", 10*ms, "gw1", 20*ms), "duplicate_gateway"},
		{rep(t0), "empty"},
		{Report{Probe: "tcp", At: t0, Measurements: []Measurement{{Gateway: "gw1", RTT: ms}}}, "probe_mismatch"},
	} {
		err := r.Add("l", "a", c.rep, t0)
		var ref *Refusal
		if !errors.As(err, &ref) || ref.Reason != c.reason || ref.Detail == "" {
			t.Errorf("%+v: %v, want %s", c.rep, err, c.reason)
		}
	}
	if _, _, ok := r.Order("l", t0); ok || r.Snapshot(10, t0).Total != 0 {
		t.Fatal("a refused report was kept")
	}
	// A refused report changes nothing even when part of it is good.
	mustAdd(t, r, "l", "a", rep(t0, "gw1", 10*ms), t0)
	if err := r.Add("l", "a", rep(t0, "gw1", 1*ms, "gw9", 1*ms), t0); err == nil {
		t.Fatal("accepted a report naming an unknown gateway")
	}
	if v := r.locs["l"].reporters["a"].votes["gw1"]; v.rtt != 10*ms {
		t.Fatalf("refused report changed a vote: %v", v.rtt)
	}
	off := NewReports()
	off.Configure(Config{}, exampleGateways(), false)
	if err := off.Add("l", "a", rep(t0, "gw1", ms), t0); err == nil {
		t.Fatal("reports off accepted one")
	}
}

// Enough distinct reporters, each one vote however often it reports, and
// the order follows the plugin's one rule on the medians (gw2's backup gw4
// second).
func TestReportsMinReportersAndOneVote(t *testing.T) {
	r := newReports(Config{})
	// One reporter reporting ten times is one reporter.
	for i := range 10 {
		mustAdd(t, r, "l", "tok1|10.0.0.1", rep(t0.Add(time.Duration(i)*time.Second), "gw1", 50*ms, "gw2", 10*ms, "gw3", 30*ms, "gw4", 90*ms), t0.Add(10*time.Second))
	}
	mustAdd(t, r, "l", "tok2|10.0.0.2", rep(t0, "gw1", 52*ms, "gw2", 12*ms, "gw3", 31*ms, "gw4", 95*ms), t0)
	now := t0.Add(10 * time.Second)
	if got, n := orderNames(t, r, "l", now); got != nil || n != 2 {
		t.Fatalf("two reporters gave %v (%d counted); want no order below min_reporters 3", got, n)
	}
	mustAdd(t, r, "l", "tok1|10.0.0.3", rep(t0, "gw1", 48*ms, "gw2", 11*ms, "gw3", 33*ms, "gw4", 80*ms), now)
	got, n := orderNames(t, r, "l", now)
	if want := []string{"gw2", "gw3", "gw1", "gw4"}; !slices.Equal(got, want) || n != 3 {
		// gw2 has no backup in exampleGateways: by RTT.
		t.Fatalf("order %v (%d reporters), want %v", got, n, want)
	}
	res, _, _ := r.Order("l", now)
	if res.RTTs[1] != 11*ms || res.RTTs[0] != 50*ms {
		t.Fatalf("medians %v, want gw1 50ms gw2 11ms", res.RTTs)
	}
	// The order rule's backups: gw2 backed by gw4.
	gws := exampleGateways()
	gws[1].Backups = []string{"gw4"}
	r.Configure(Config{Enabled: true}, gws, false)
	if got, _ := orderNames(t, r, "l", now); !slices.Equal(got, []string{"gw2", "gw4", "gw3", "gw1"}) {
		t.Fatalf("with gw2's backup gw4: %v", got)
	}
	// Other locations are not touched.
	if got, _ := orderNames(t, r, "other", now); got != nil {
		t.Fatalf("another location got %v", got)
	}
}

// A few liars cannot move the median: two reporters of five saying the
// far gw3 is 1 ms leave gw2 first; one liar alone cannot promote a gateway
// the honest reporters did not measure or found failed.
func TestReportsLiarsCannotMoveTheMedian(t *testing.T) {
	r := newReports(Config{})
	for i := range 5 {
		mustAdd(t, r, "l", fmt.Sprintf("honest%d", i), rep(t0, "gw1", 80*ms, "gw2", time.Duration(20+i)*ms, "gw3", 300*ms, "gw4", "fail"), t0)
	}
	for i := range 2 {
		mustAdd(t, r, "l", fmt.Sprintf("liar%d", i), rep(t0, "gw3", 1*ms, "gw4", 1*ms), t0)
	}
	got, n := orderNames(t, r, "l", t0)
	if n != 7 || len(got) == 0 || got[0] != "gw2" {
		t.Fatalf("with 2 liars of 7: %v (%d reporters), want gw2 first", got, n)
	}
	res, _, _ := r.Order("l", t0)
	if res.RTTs[2] != 300*ms || res.RTTs[3] != 0 {
		t.Fatalf("gw3 median %v (want 300ms), gw4 %v (want unmeasured: 5 of 7 failed it)", res.RTTs[2], res.RTTs[3])
	}
	// A liar alone on a gateway nobody else measured: fewer votes than
	// min_reporters, unmeasured.
	r2 := newReports(Config{})
	for i := range 3 {
		mustAdd(t, r2, "l", fmt.Sprintf("h%d", i), rep(t0, "gw1", 80*ms, "gw2", 20*ms), t0)
	}
	mustAdd(t, r2, "l", "liar", rep(t0, "gw3", 1*ms), t0)
	if got, _ := orderNames(t, r2, "l", t0); got[0] != "gw2" {
		t.Fatalf("a lone liar promoted %v", got)
	}
	// Liars outnumbering the honest ones do win: the bound is a majority.
	for i := range 4 {
		mustAdd(t, r, "l", fmt.Sprintf("liar%d", i+2), rep(t0, "gw3", 1*ms), t0)
	}
	if got, _ := orderNames(t, r, "l", t0); got[0] != "gw3" {
		t.Fatalf("6 liars of 11 did not move it: %v", got)
	}
}

func TestReportsWindow(t *testing.T) {
	r := newReports(Config{Window: time.Hour})
	for i := range 3 {
		mustAdd(t, r, "l", fmt.Sprint(i), rep(t0.Add(time.Duration(i)*time.Minute), "gw1", 10*ms), t0.Add(3*time.Minute))
	}
	if got, _ := orderNames(t, r, "l", t0.Add(59*time.Minute)); got == nil {
		t.Fatal("no order inside the window")
	}
	// The first reporter's vote leaves the window: two left.
	if got, n := orderNames(t, r, "l", t0.Add(60*time.Minute)); got != nil || n != 2 {
		t.Fatalf("after the first vote expired: %v, %d reporters", got, n)
	}
	if got, _ := orderNames(t, r, "l", t0.Add(3*time.Hour)); got != nil || r.Snapshot(10, t0.Add(3*time.Hour)).Total != 0 {
		t.Fatal("expired location kept")
	}
	// A late report of an older run does not replace a newer vote.
	mustAdd(t, r, "m", "a", rep(t0.Add(10*time.Minute), "gw1", 10*ms), t0.Add(10*time.Minute))
	mustAdd(t, r, "m", "a", rep(t0.Add(5*time.Minute), "gw1", 99*ms), t0.Add(10*time.Minute))
	if v := r.locs["m"].reporters["a"].votes["gw1"]; v.rtt != 10*ms {
		t.Fatalf("older run replaced the newer vote: %v", v.rtt)
	}
}

func TestReportsBounded(t *testing.T) {
	r := newReports(Config{MaxLocations: 3, MaxReporters: 4, MinReporters: 2})
	for i := range 10 {
		for j := range 10 {
			now := t0.Add(time.Duration(i*10+j) * time.Second)
			mustAdd(t, r, fmt.Sprint("loc", i), fmt.Sprint("who", j), rep(now, "gw1", 10*ms), now)
		}
	}
	if len(r.locs) != 3 {
		t.Fatalf("%d locations, bound 3", len(r.locs))
	}
	for k, l := range r.locs {
		if len(l.reporters) != 4 {
			t.Fatalf("%s: %d reporters, bound 4", k, len(l.reporters))
		}
	}
	if _, ok := r.locs["loc9"]; !ok {
		t.Fatal("the newest location was evicted")
	}
	if _, ok := r.locs["loc9"].reporters["who9"]; !ok {
		t.Fatal("the newest reporter was evicted")
	}
	// A lowered bound trims.
	r.Configure(Config{Enabled: true, MaxLocations: 1, MaxReporters: 2, MinReporters: 2}, exampleGateways(), false)
	if len(r.locs) != 1 || len(r.locs["loc9"].reporters) != 2 {
		t.Fatalf("after lowering the bounds: %d locations", len(r.locs))
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{[]time.Duration{3, 1, 2}, 2},
		{[]time.Duration{4, 1, 2, 3}, 2},
		{[]time.Duration{1, 1 << 62, 1 << 62, 1 << 62}, 1 << 62},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
