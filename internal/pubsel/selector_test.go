package pubsel

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/sticky"
)

const ms = time.Millisecond

type up struct {
	addr  string
	down  bool // the framework's health says no
	conns int
}

type upHost struct{}

func (upHost) Addr(u *up) string    { return u.addr }
func (upHost) Available(u *up) bool { return !u.down }
func (upHost) Conns(u *up) int      { return u.conns }

func newTracker(t testing.TB, cfg Config) *Tracker {
	t.Helper()
	if cfg.Hysteresis == 0 {
		cfg.Hysteresis = DefaultHysteresis
	}
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// measure records one probe round with the given best RTT (0: all failed),
// registering addr for good if it is not a target yet.
func measure(t testing.TB, tr *Tracker, addr string, rtt time.Duration) {
	t.Helper()
	tr.mu.Lock()
	tg := tr.targets[addr]
	tr.mu.Unlock()
	if tg == nil {
		id, err := tr.Ensure(addr)
		if err != nil {
			t.Fatal(err)
		}
		tg = (*tr.byID.Load())[id]
	}
	r := latency.Result{RTTs: []time.Duration{rtt}, Best: rtt, OK: 1}
	if rtt == 0 {
		r = latency.Result{RTTs: []time.Duration{0}, Err: errors.New("connection refused")}
	}
	tr.record(tg, r, time.Now(), tr.epoch.Load())
}

func pubs(n int) []*up {
	out := make([]*up, n)
	for i := range out {
		out[i] = &up{addr: fmt.Sprintf("publisher%d:443", i+1)}
	}
	return out
}

func counts(t *testing.T, s *Selector[*up], pool []*up, n int, user func(int) string) map[string]int {
	t.Helper()
	c := map[string]int{}
	for i := range n {
		u, _, ok := s.Select(pool, user(i), "app", int64(i))
		if !ok {
			t.Fatal("no upstream selected")
		}
		c[u.addr]++
	}
	return c
}

// Netskope's table: publishers 1 and 2 at 10 and 12 ms, 3 and 4 at 42 ms:
// only 1 or 2 is ever chosen, both are.
func TestNetskopeTableOnlyLowestBucket(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(4)
	for i, d := range []time.Duration{10 * ms, 12 * ms, 42 * ms, 42 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	s := &Selector[*up]{Tracker: tr, Host: upHost{}}
	c := counts(t, s, p, 2000, func(int) string { return "" })
	if c["publisher3:443"]+c["publisher4:443"] != 0 {
		t.Fatalf("picked outside [0,32): %v", c)
	}
	if c["publisher1:443"] < 800 || c["publisher2:443"] < 800 {
		t.Fatalf("not random within the bucket: %v", c)
	}
	_, d, _ := s.Select(p, "", "", 0)
	if d.Status == nil || d.Status.Bucket != 0 || d.Status.Latency > 12*ms {
		t.Fatalf("decision %+v", d.Status)
	}
}

// Netskope's FAQ: apps #1 Jira {1,2}, #2 SQL Server {1,3,4}, #3 Web Server
// {1,2,3,4}; publisher 1 in [32,64), 3 and 4 in [0,32) (2 too, at 12 ms).
func TestNetskopeFAQStickiness(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(4)
	for i, d := range []time.Duration{40 * ms, 12 * ms, 10 * ms, 20 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	table := sticky.New(10000, time.Hour)
	sel := func() *Selector[*up] { return &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table} }
	app2, app3 := sel(), sel()
	pool2 := []*up{p[0], p[2], p[3]}
	pool3 := []*up{p[0], p[1], p[2], p[3]}

	// User A on app #2 gets 3 or 4, and keeps it for 100 requests.
	first, d, _ := app2.Select(pool2, "userA", "sql", 1)
	if first != p[2] && first != p[3] {
		t.Fatalf("user A on app #2 got %s", first.addr)
	}
	if d.Sticky {
		t.Fatal("first pick reported as sticky")
	}
	for i := range 100 {
		u, d, _ := app2.Select(pool2, "userA", "sql", int64(i))
		if u != first || !d.Sticky {
			t.Fatalf("request %d moved from %s to %s", i, first.addr, u.addr)
		}
	}

	// User A on app #3 is another pair: a pick of its own from app #3's
	// pool, not app #2's pin (which is in that pool too), and a second
	// entry in the shared table. Both pins then hold side by side.
	onWeb, d, _ := app3.Select(pool3, "userA", "web", 2)
	if d.Sticky || onWeb == p[0] || table.Len() != 2 {
		t.Fatalf("user A on app #3: %s sticky %v, %d entries; want a new pick in [0,32) and 2 entries", onWeb.addr, d.Sticky, table.Len())
	}
	for i := range 50 {
		if u, d, _ := app3.Select(pool3, "userA", "web", int64(3+i)); u != onWeb || !d.Sticky {
			t.Fatalf("request %d: user A on app #3 moved from %s to %s", i, onWeb.addr, u.addr)
		}
		if u, d, _ := app2.Select(pool2, "userA", "sql", int64(3+i)); u != first || !d.Sticky {
			t.Fatalf("request %d: user A on app #2 moved from %s to %s", i, first.addr, u.addr)
		}
	}
	// Across many users app #3 picks every publisher of its lowest bucket.
	seen3 := map[*up]bool{}
	for i := range 300 {
		u, _, _ := app3.Select(pool3, fmt.Sprint("web-user-", i), "web", 1)
		seen3[u] = true
	}
	if seen3[p[0]] || len(seen3) != 3 {
		t.Fatalf("app #3 picks %v: want all of 2, 3, 4 and never 1", seen3)
	}

	// User B is independent of A: across many users both 3 and 4 serve app #2.
	seen2 := map[*up]int{}
	for i := range 200 {
		u, _, _ := app2.Select(pool2, fmt.Sprint("userB-", i), "sql", 1)
		seen2[u]++
	}
	if seen2[p[0]] != 0 || seen2[p[2]] < 50 || seen2[p[3]] < 50 {
		t.Fatalf("app #2 users spread %v", seen2)
	}

	// A's publisher goes down: the next request moves, then sticks again.
	measure(t, tr, first.addr, 0)
	moved, d, _ := app2.Select(pool2, "userA", "sql", 200)
	other := p[2]
	if first == p[2] {
		other = p[3]
	}
	if moved != other || d.Sticky {
		t.Fatalf("after failure user A went to %s (sticky %v), want %s", moved.addr, d.Sticky, other.addr)
	}
	// Even when the old publisher comes back, A stays on the new one.
	measure(t, tr, first.addr, 10*ms)
	for i := range 100 {
		if u, _, _ := app2.Select(pool2, "userA", "sql", int64(300+i)); u != other {
			t.Fatalf("request %d after failover went to %s", i, u.addr)
		}
	}
}

// A pin holds while its publisher is active and available, even when
// another publisher lands in a lower bucket or the pinned one drops to a
// higher bucket: stickiness outranks latency. New pairs follow the lowest
// bucket.
func TestPinOutlastsALowerBucket(t *testing.T) {
	tr := newTracker(t, Config{Window: 1})
	p := pubs(2)
	measure(t, tr, p[0].addr, 40*ms) // [32,64)
	measure(t, tr, p[1].addr, 80*ms) // [64,128)
	table := sticky.New(1000, time.Hour)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}
	if u, _, _ := s.Select(p, "alice", "app", 0); u != p[0] {
		t.Fatalf("alice first went to %s, want publisher1 (the only one in [32,64))", u.addr)
	}
	measure(t, tr, p[1].addr, 5*ms) // publisher2 now in [0,32), lower
	if st := tr.StatusOf(1); st.Bucket != 0 {
		t.Fatalf("publisher2 in bucket %d, want 0", st.Bucket)
	}
	for i := range 50 {
		if u, d, _ := s.Select(p, "alice", "app", int64(1+i)); u != p[0] || !d.Sticky || d.Status.Bucket != 1 {
			t.Fatalf("request %d: alice went to %s (sticky %v), pinned to publisher1", i, u.addr, d.Sticky)
		}
	}
	if u, d, _ := s.Select(p, "bob", "app", 60); u != p[1] || d.Sticky {
		t.Fatalf("new pair bob went to %s, want publisher2 in the lowest bucket", u.addr)
	}
	measure(t, tr, p[0].addr, 300*ms) // publisher1 itself drops to [256,512)
	if u, d, _ := s.Select(p, "alice", "app", 70); u != p[0] || !d.Sticky {
		t.Fatalf("alice left publisher1 for %s when its bucket rose", u.addr)
	}
}

// Caddy's own health (Available) also breaks stickiness.
func TestStickyEntryYieldsToFrameworkHealth(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(2)
	measure(t, tr, p[0].addr, 5*ms)
	measure(t, tr, p[1].addr, 6*ms)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: sticky.New(1000, time.Hour)}
	u, _, _ := s.Select(p, "a", "x", 0)
	u.down = true
	v, _, ok := s.Select(p, "a", "x", 1)
	if !ok || v == u {
		t.Fatalf("got %v on a down publisher", v.addr)
	}
	u.down = false
	if w, _, _ := s.Select(p, "a", "x", 2); w != v {
		t.Fatal("did not stick to the replacement")
	}
}

func TestUnmeasuredRankLastAndInactiveNever(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: sticky.New(1000, time.Hour)}
	// Nothing measured yet: any publisher serves, and nothing is pinned.
	if _, d, ok := s.Select(p, "a", "x", 0); !ok || d.Status.Measured || s.Sticky.Len() != 0 {
		t.Fatalf("ok=%v decision=%+v len=%d", ok, d.Status, s.Sticky.Len())
	}
	measure(t, tr, p[2].addr, 300*ms) // slow, but measured: ranks before unmeasured
	measure(t, tr, p[1].addr, 0)      // inactive
	c := counts(t, s, p, 200, func(i int) string { return fmt.Sprint(i) })
	if c["publisher3:443"] != 200 {
		t.Fatalf("want the measured publisher only: %v", c)
	}
	measure(t, tr, p[2].addr, 0)
	c = counts(t, s, p, 200, func(i int) string { return fmt.Sprint("z", i) })
	if c["publisher1:443"] != 200 {
		t.Fatalf("want the unmeasured publisher when the others are inactive: %v", c)
	}
	measure(t, tr, p[0].addr, 0)
	if u, _, ok := s.Select(p, "q", "x", 0); ok {
		t.Fatalf("all inactive, yet %s was selected", u.addr)
	}
}

func TestLatencyOffBalancesAllActive(t *testing.T) {
	tr := newTracker(t, Config{NoBuckets: true})
	p := pubs(3)
	for i, d := range []time.Duration{5 * ms, 50 * ms, 500 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: sticky.New(1000, time.Hour)}
	c := counts(t, s, p, 900, func(i int) string { return fmt.Sprint(i) })
	for _, x := range p {
		if c[x.addr] < 200 {
			t.Fatalf("latency off did not spread: %v", c)
		}
	}
	u, _, _ := s.Select(p, "same", "x", 1)
	for i := range 50 {
		if v, _, _ := s.Select(p, "same", "x", int64(i)); v != u {
			t.Fatal("latency off is not sticky")
		}
	}
}

func TestLeastConnWithinBucket(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	for i, d := range []time.Duration{5 * ms, 6 * ms, 70 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	p[0].conns, p[1].conns, p[2].conns = 9, 3, 0
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinLeastConn}
	for range 50 {
		if u, _, _ := s.Select(p, "", "", 0); u != p[1] {
			t.Fatalf("least_conn within the bucket picked %s", u.addr)
		}
	}
}

// Segments add to the probed latency; hysteresis keeps a publisher near a
// boundary in its bucket.
func TestSegmentAndHysteresis(t *testing.T) {
	tr := newTracker(t, Config{Segments: map[string]time.Duration{"publisher1:443": 30 * ms}, Window: 1})
	measure(t, tr, "publisher1:443", 5*ms)
	st := tr.StatusOf(0)
	if st.Latency != 35*ms || st.Probed != 5*ms || st.Bucket != 1 {
		t.Fatalf("status %+v", st)
	}
	measure(t, tr, "publisher1:443", 1*ms) // 31 ms: within 10% of [32,64)'s lower bound
	if st := tr.StatusOf(0); st.Bucket != 1 {
		t.Fatalf("flapped to bucket %d at %v", st.Bucket, st.Latency)
	}
}

func TestWindowMinimum(t *testing.T) {
	tr := newTracker(t, Config{Window: 2})
	for _, d := range []time.Duration{50 * ms, 20 * ms, 40 * ms} {
		measure(t, tr, "a:1", d)
	}
	if st := tr.StatusOf(0); st.Latency != 20*ms {
		t.Fatalf("window min %v, want 20ms", st.Latency)
	}
	measure(t, tr, "a:1", 45*ms) // 20 ms has left the 2-round window
	if st := tr.StatusOf(0); st.Latency != 40*ms {
		t.Fatalf("window min %v, want 40ms", st.Latency)
	}
}

func TestConfigValidateNamesOption(t *testing.T) {
	for _, c := range []Config{
		{BucketWidth: -1}, {Probes: -1}, {Hysteresis: 1.5}, {Window: -2},
		{Segments: map[string]time.Duration{"x:1": -ms}},
	} {
		if _, err := NewTracker(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// Until any publisher of the pool is measured, picks are random over the
// publishers Caddy calls available, even those whose probe rounds failed
// (a probe that never succeeds must not refuse every connection), and
// nothing is pinned. The first measurement ends the fallback.
func TestFallbackUntilMeasured(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	for _, x := range p {
		measure(t, tr, x.addr, 0) // every round failed: inactive, unmeasured
	}
	p[2].down = true // Caddy's health says no
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: sticky.New(1000, time.Hour)}
	c := counts(t, s, p, 400, func(i int) string { return fmt.Sprint(i) })
	if c["publisher1:443"] < 100 || c["publisher2:443"] < 100 || c["publisher3:443"] != 0 {
		t.Fatalf("fallback picks %v: want 1 and 2, never the unavailable 3", c)
	}
	if s.Sticky.Len() != 0 {
		t.Fatalf("%d pairs pinned before any measurement", s.Sticky.Len())
	}
	measure(t, tr, p[1].addr, 10*ms)
	c = counts(t, s, p, 100, func(i int) string { return fmt.Sprint(i) })
	if c["publisher2:443"] != 100 || s.Sticky.Len() != 100 {
		t.Fatalf("after a measurement: %v, %d pinned", c, s.Sticky.Len())
	}
}

// SelectUnpinned, for a request with no (user, app) pair, picks from the
// lowest bucket like Select but neither follows nor makes a pin.
func TestSelectUnpinned(t *testing.T) {
	tr := newTracker(t, Config{})
	p := pubs(3)
	for i, d := range []time.Duration{5 * ms, 6 * ms, 70 * ms} {
		measure(t, tr, p[i].addr, d)
	}
	table := sticky.New(1000, time.Hour)
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}
	pinned, _, _ := s.Select(p, "", "", 0) // the empty pair has a pin
	c := map[*up]int{}
	for i := range 400 {
		u, d, ok := s.SelectUnpinned(p, int64(i))
		if !ok || d.Sticky || d.Status == nil {
			t.Fatalf("unpinned pick %d: ok %v decision %+v", i, ok, d)
		}
		c[u]++
	}
	if table.Len() != 1 || c[p[2]] != 0 || c[p[0]] < 100 || c[p[1]] < 100 {
		t.Fatalf("unpinned picks %v (pinned %s), %d entries: want both of [0,32), no new entry", c, pinned.addr, table.Len())
	}
}
