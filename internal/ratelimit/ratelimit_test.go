package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// A worked trace of dynamic throttling: static 1000, table 55→30 %,
// 60→40 %, 65→50 %, reversal below 50 %, hold 30 s, step 20 %.
func TestDynamicThrottleTrace(t *testing.T) {
	d, err := NewDynamic([]Step{{55, 30}, {60, 40}, {65, 50}}, 50, 30*time.Second, 20)
	if err != nil {
		t.Fatal(err)
	}
	rule, _ := NewRule("gx-ccr-i", 1000, 0)
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	limit := func(load float64, sec int) int {
		rule.SetThrottle(d.Sample(load, at(sec)))
		return int(math.Round(rule.Effective()))
	}
	steps := []struct {
		sec  int
		load float64
		want int
		what string
	}{
		{0, 40, 1000, "below every threshold: no throttling"},
		{5, 62, 600, "62 %: 40 % throttled"},
		{10, 60, 600, "stays within 60-65"},
		{15, 64.9, 600, "stays within 60-65"},
		{20, 49, 600, "49 %: reversal starts, held"},
		{35, 48, 600, "still within the hold"},
		{50, 49, 800, "30 s at or below 49: one step back"},
		{55, 57, 700, "57 %: 30 %"},
		{60, 67, 500, "67 %: 50 %"},
		{65, 55, 700, "55 %: 30 %"},
		{70, 49, 700, "reversal starts again"},
		{85, 52, 700, "between reversal and table: held, hold restarts"},
		{90, 45, 700, "below again"},
		{120, 45, 900, "30 s below: 10 %"},
		{135, 30, 900, "within the next hold"},
		{150, 30, 1000, "another 30 s: reversal complete"},
		{200, 20, 1000, "stays unthrottled"},
	}
	for _, s := range steps {
		if got := limit(s.load, s.sec); got != s.want {
			t.Fatalf("t=%ds load %v%%: limit %d, want %d (%s)", s.sec, s.load, got, s.want, s.what)
		}
	}
}

func TestDynamicValidation(t *testing.T) {
	for _, c := range []struct {
		table    []Step
		reversal float64
		hold     time.Duration
		step     int
	}{
		{nil, 50, time.Second, 20},
		{[]Step{{55, 30}, {50, 40}}, 40, time.Second, 20}, // thresholds fall
		{[]Step{{55, 30}, {60, 20}}, 50, time.Second, 20}, // throttles fall
		{[]Step{{55, 130}}, 50, time.Second, 20},          // throttle out of range
		{[]Step{{155, 30}}, 50, time.Second, 20},          // threshold out of range
		{[]Step{{55, 30}}, 60, time.Second, 20},           // reversal above the table
		{[]Step{{55, 30}}, 50, 0, 20},                     // no hold
		{[]Step{{55, 30}}, 50, time.Second, 0},            // no step
	} {
		if _, err := NewDynamic(c.table, c.reversal, c.hold, c.step); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// Over 10 s of simulated time at twice the limit, the admitted count is
// within 1 % of the limit × 10 s.
func TestGCRAAccuracySimulated(t *testing.T) {
	for _, r := range []float64{1, 200, 1000, 50_000} {
		rule, _ := NewRule("x", r, 0)
		var b Bucket
		admitted := 0
		step := int64(float64(time.Second) / (2 * r))
		for now := int64(0); now < int64(10*time.Second); now += step {
			if b.Allow(rule, now) {
				admitted++
			}
		}
		want := 10 * r
		if math.Abs(float64(admitted)-want) > math.Max(want*0.01, 1) {
			t.Errorf("rate %v: admitted %d in 10 s, want %v ±1 %%", r, admitted, want)
		}
	}
}

// The same with the real clock and 8 goroutines hammering one bucket for
// 2 s. The bound has slack for the burst and the clock, never for excess.
func TestGCRAAccuracyRealClock(t *testing.T) {
	rule, _ := NewRule("x", 500, 0)
	var b Bucket
	var admitted atomic.Int64
	start := time.Now()
	end := start.Add(2 * time.Second)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if b.Allow(rule, time.Now().UnixNano()) {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	got := float64(admitted.Load())
	max := 500*elapsed + float64(rule.Burst) + 1
	// The upper bound is the point; the lower one only catches a limiter
	// that stops admitting: a starved process (the race detector on a busy
	// 2-core machine) loses every slot it was not scheduled for, beyond
	// the burst. TestGCRAAccuracySimulated checks the rate on a simulated clock.
	if got > max || got < 500*2*0.5 {
		t.Fatalf("admitted %v over %.2fs; want at most %.0f and at least half of 1000", got, elapsed, max)
	}
}

// A limit of R admits R: over 10 s of simulated time, a client
// paced at R whose requests scheduling delays by up to 20 ms, and one
// offering 1.1 × R with the same jitter, are each admitted at ≥ 0.99 × R,
// at every rate from 1/s up, under the default burst. Never more than the
// rate and the burst.
func TestDefaultBurstAdmitsPacedClients(t *testing.T) {
	const window = int64(10 * time.Second)
	const jitter = int64(20 * time.Millisecond)
	for _, r := range []float64{1, 2, 5, 10, 19, 20, 21, 39, 40, 41, 100, 333, 1000, 10_000, 50_000} {
		for _, offered := range []float64{1, 1.1} {
			rule, _ := NewRule("x", r, 0)
			rng := rand.New(rand.NewPCG(uint64(r), uint64(offered*10)))
			var b Bucket
			gap := float64(time.Second) / (r * offered)
			sent, admitted := 0, 0
			last := int64(0)
			for k := 0; ; k++ {
				// The pacer sends on its own schedule (k × gap); the
				// scheduler delays each request by up to jitter. Requests
				// may arrive out of order, as concurrent ones do.
				at := int64(float64(k)*gap) + rng.Int64N(jitter+1)
				if int64(float64(k)*gap) >= window {
					break
				}
				sent++
				last = max(last, at)
				if b.Allow(rule, at) {
					admitted++
				}
			}
			elapsed := float64(last) / float64(time.Second)
			want := 0.99 * r * min(elapsed, 10)
			if offered == 1 {
				want = 0.99 * float64(sent)
			}
			if float64(admitted) < want {
				t.Errorf("rate %v, client at %v × the rate: admitted %d of %d in %.3f s, want at least %.1f (burst %d)",
					r, offered, admitted, sent, elapsed, want, rule.Burst)
			}
			if most := int(r*elapsed) + rule.Burst + 1; admitted > most {
				t.Errorf("rate %v, client at %v × the rate: admitted %d in %.3f s, more than %d", r, offered, admitted, elapsed, most)
			}
		}
	}
}

// The burst follows the dynamic throttle: at 75 % throttled, a
// limit of 1000 admits 250/s with the default burst of 250/s (14), so over
// 10 s of a client at twice the rate the overshoot is at most 0.5 % plus
// two requests, as unthrottled — not the 2 % that 1000/s's burst of 51
// would allow. A configured burst keeps its span of traffic.
func TestBurstFollowsThrottle(t *testing.T) {
	rule, _ := NewRule("x", 1000, 0)
	rule.SetThrottle(75)
	if got := rule.EffectiveBurst(); got != DefaultBurst(250) {
		t.Fatalf("burst at 75 %% throttled: %d, want %d", got, DefaultBurst(250))
	}
	var b Bucket
	admitted := 0
	for now := int64(0); now < int64(10*time.Second); now += int64(time.Second) / 500 {
		if b.Allow(rule, now) {
			admitted++
		}
	}
	if most := 2512 + 2 + 1; admitted > most || admitted < 2500 {
		t.Errorf("75 %% throttled, 10 s at 500/s: admitted %d, want 2500 to %d", admitted, most)
	}
	rule.SetThrottle(0)
	if rule.EffectiveBurst() != rule.Burst {
		t.Errorf("unthrottled burst %d, want %d", rule.EffectiveBurst(), rule.Burst)
	}
	set, _ := NewRule("y", 100, 10)
	for pct, want := range map[int]int{0: 10, 50: 5, 80: 2, 95: 2} {
		if set.SetThrottle(pct); set.EffectiveBurst() != want {
			t.Errorf("configured burst 10 at rate 100, %d %% throttled: %d, want %d", pct, set.EffectiveBurst(), want)
		}
	}
	one, _ := NewRule("z", 100, 1)
	if one.SetThrottle(50); one.EffectiveBurst() != 1 {
		t.Errorf("configured burst 1, throttled: %d, want 1", one.EffectiveBurst())
	}
}

func TestThrottleToZeroAdmitsNothing(t *testing.T) {
	rule, _ := NewRule("x", 100, 0)
	rule.SetThrottle(100)
	var b Bucket
	b.tat.Store(int64(time.Hour)) // drain
	for now := int64(time.Hour); now < int64(time.Hour+10*time.Second); now += int64(time.Millisecond) {
		if b.Allow(rule, now) {
			t.Fatal("a fully throttled rule admitted an event")
		}
	}
}

func TestNewRuleRejectsBadRates(t *testing.T) {
	for _, r := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := NewRule("x", r, 0); err == nil {
			t.Errorf("rate %v accepted", r)
		}
	}
	if _, err := NewRule("x", 1, -1); err == nil {
		t.Error("negative burst accepted")
	}
}

func TestTableBoundedAndSwept(t *testing.T) {
	tb := NewTable(64 * 4)
	rule, _ := NewRule("x", 10, 1)
	for i := range 10_000 {
		tb.Bucket(fmt.Sprint("peer-", i), int64(i)).Allow(rule, int64(i))
	}
	if n := tb.Len(); n > 64*4 {
		t.Fatalf("%d buckets, bound %d", n, 64*4)
	}
	b := tb.Bucket("a", 0)
	if tb.Bucket("a", 1) != b {
		t.Fatal("same key, different bucket")
	}
	later := int64(time.Hour)
	if n := tb.Sweep(later, later); n == 0 || tb.Len() != 0 {
		t.Fatalf("sweep dropped %d, %d left", n, tb.Len())
	}
}

// The bound means what it says, and a peer in use keeps its bucket under a
// key-rotation flood: a table of n holds n peers, and while
// another client cycles through fresh names — fewer than n between two
// requests of an active peer — the active peer, offering twice its limit,
// never gets a fresh burst: it is admitted at most rate × time + burst, at
// every size. (With the bound split over 64 shards, max_peers 100 held 64
// peers and any new name landing in the active peer's shard evicted it.)
func TestSmallTableKeyRotationFloodNextToActivePeer(t *testing.T) {
	for _, n := range []int{2, 10, 100, 1000, 5000, 20_000} {
		tb := NewTable(n)
		for i := range n {
			tb.Bucket(fmt.Sprint("fill-", i), 0)
		}
		if got := tb.Len(); got != n {
			t.Errorf("size %d: holds %d after %d keys", n, got, n)
		}
		rule, _ := NewRule("x", 10, 0)
		admitted, rotated := 0, 0
		step := int64(time.Second) / 20 // twice the limit
		end := int64(10 * time.Second)
		for now := int64(0); now < end; now += step {
			if tb.Bucket("active", now).Allow(rule, now) {
				admitted++
			}
			for range max(1, n/2) {
				tb.Bucket(fmt.Sprint("rotating-", rotated), now)
				rotated++
			}
			if got := tb.Len(); got > n {
				t.Fatalf("size %d: holds %d", n, got)
			}
		}
		if most := int(rule.Rate*float64(end)/float64(time.Second)) + rule.Burst + 1; admitted > most {
			t.Errorf("size %d: the active peer was admitted %d times in 10 s next to %d rotating names, want at most %d: its bucket was evicted while in use",
				n, admitted, rotated, most)
		}
		if got := tb.Len(); got != n {
			t.Errorf("size %d: holds %d at the end", n, got)
		}
	}
}

// Decision cost against golang.org/x/time/rate's Allow (the anchor).
func BenchmarkAllow(b *testing.B) {
	b.Run("anchor_x_time_rate/serial", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1e9), 1e9)
		for b.Loop() {
			l.Allow()
		}
	})
	b.Run("gcra/serial", func(b *testing.B) {
		rule, _ := NewRule("x", 1e9, 1e9)
		var bk Bucket
		for b.Loop() {
			bk.Allow(rule, time.Now().UnixNano())
		}
	})
	b.Run("anchor_x_time_rate/parallel", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1e9), 1e9)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
	b.Run("gcra/parallel", func(b *testing.B) {
		rule, _ := NewRule("x", 1e9, 1e9)
		var bk Bucket
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				bk.Allow(rule, time.Now().UnixNano())
			}
		})
	})
	b.Run("gcra_keyed_table/parallel", func(b *testing.B) {
		rule, _ := NewRule("x", 1e9, 1e9)
		tb := NewTable(100_000)
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		}
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				now := time.Now().UnixNano()
				tb.Bucket(keys[i%len(keys)], now).Allow(rule, now)
				i++
			}
		})
	})
}

// The worked example of a profile: pGW2 overall 1000/s, Gx CCR-I 200/s,
// CCR-T 200/s, everything else forwarded as received. One simulated second at 500/s of
// each of CCR-I, CCR-T and CCR-U.
func TestProfilePGW2Example(t *testing.T) {
	overall, _ := NewRule("overall", 1000, 0)
	ccri, _ := NewRule("gx-ccr-i", 200, 0)
	ccrt, _ := NewRule("gx-ccr-t", 200, 0)
	p := NewProfile("pgw2", overall, []*Rule{ccri, ccrt}, 1000)
	admitted := map[string]int{}
	refusedBy := map[string]int{}
	step := int64(time.Second / 500)
	for now := int64(0); now < int64(time.Second); now += step {
		for _, typ := range []string{"gx-ccr-i", "gx-ccr-t", "gx-ccr-u"} {
			if ok, limit := p.Decide("pgw2.example", typ, now); ok {
				admitted[typ]++
			} else {
				refusedBy[limit]++
			}
		}
	}
	for _, typ := range []string{"gx-ccr-i", "gx-ccr-t"} {
		if admitted[typ] < 198 || admitted[typ] > 212 {
			t.Errorf("%s admitted %d in 1 s, want ~200", typ, admitted[typ])
		}
	}
	if admitted["gx-ccr-u"] != 500 {
		t.Errorf("CCR-U admitted %d of 500: unlimited types pass (overall 1000 not reached)", admitted["gx-ccr-u"])
	}
	// Another peer has its own buckets.
	if ok, _ := p.Decide("pgw1.example", "gx-ccr-i", int64(time.Second)-1); !ok {
		t.Error("a second peer was refused by the first one's limit")
	}
	// The overall limit: CCR-U alone at 1500/s for a second → ~1000.
	p2 := NewProfile("pgw2", overall, nil, 1000)
	n := 0
	for now := int64(0); now < int64(time.Second); now += int64(time.Second / 1500) {
		if ok, limit := p2.Decide("pgw2", "gx-ccr-u", now); ok {
			n++
		} else if limit != "overall" {
			t.Fatalf("refused by %q", limit)
		}
	}
	if n < 990 || n > 1060 {
		t.Errorf("overall admitted %d in 1 s, want ~1000", n)
	}
}

// A message refused by the overall limit does not use up its type's limit.
func TestProfileRefundsTypeOnOverallRefusal(t *testing.T) {
	overall, _ := NewRule("overall", 1, 1)
	typed, _ := NewRule("t", 1, 1)
	p := NewProfile("p", overall, []*Rule{typed}, 100)
	if ok, _ := p.Decide("k", "other", 0); !ok {
		t.Fatal("first message refused")
	}
	if ok, limit := p.Decide("k", "t", 0); ok || limit != "overall" {
		t.Fatalf("got %v %q, want refusal by overall", ok, limit)
	}
	overall.SetThrottle(0)
	p.overall.Bucket("k", 0).tat.Store(0) // overall refilled
	if ok, _ := p.Decide("k", "t", 0); !ok {
		t.Fatal("the type's token was not refunded")
	}
}

// BenchmarkTableBytesPerKey fills a table with 1M peers and reports the
// heap bytes per peer; each iteration is then a lookup of a known peer.
func BenchmarkTableBytesPerKey(b *testing.B) {
	const n = 1 << 20
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := NewTable(n + n/4)
	for i, k := range keys {
		tb.Bucket(k, int64(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perKey := float64(after.HeapAlloc-before.HeapAlloc) / float64(tb.Len())
	b.ResetTimer()
	i := 0
	for b.Loop() {
		tb.Bucket(keys[(i*4099)%n], 1)
		i++
	}
	b.ReportMetric(perKey, "B/peer")
}

// countAllower admits the first n requests, recording the keys.
type countAllower struct {
	n    int
	keys []string
}

func (c *countAllower) Allow(key string, now int64) bool {
	c.keys = append(c.keys, key)
	c.n--
	return c.n >= 0
}

// TestProfileGlobalOverall: with SetGlobal, the overall limit is decided
// by the Allower (a cluster-wide share), message limits stay local, and a
// refusal by the overall limit still refunds the message's.
func TestProfileGlobalOverall(t *testing.T) {
	overall, _ := NewRule("overall", 1, 1)
	msg, _ := NewRule("m", 1000, 0)
	p := NewProfile("p", overall, []*Rule{msg}, 10)
	g := &countAllower{n: 5}
	p.SetGlobal(g)
	now := int64(1e18)
	admitted := 0
	for range 8 {
		if ok, _ := p.Decide("peer", "", now); ok {
			admitted++
		}
	}
	if admitted != 5 || len(g.keys) != 8 {
		t.Fatalf("admitted %d (want the Allower's 5), Allower asked %d times (want 8)", admitted, len(g.keys))
	}
	if ok, limit := p.Decide("peer", "m", now); ok || limit != "overall" {
		t.Fatalf("typed message past the global limit: ok %v limit %q", ok, limit)
	}
	if p.Global() != g {
		t.Fatal("Global does not return the Allower")
	}
}

// fakeGlobal is a cluster-wide limit's Allower and Refunder: it admits n
// requests and counts refunds.
type fakeGlobal struct {
	left, refunds int
}

func (g *fakeGlobal) Allow(string, int64) bool {
	if g.left == 0 {
		return false
	}
	g.left--
	return true
}
func (g *fakeGlobal) Refund(string, int64) { g.left++; g.refunds++ }

// A message type with a global limit is decided by it, not by its table,
// and gets its admission back when the overall limit refuses the message.
func TestMessageGlobal(t *testing.T) {
	overall, _ := NewRule("overall", 1, 2)
	typ, _ := NewRule("gx-ccr-i", 1000, 0)
	p := NewProfile("p", overall, []*Rule{typ}, 100)
	g := &fakeGlobal{left: 3}
	p.SetMessageGlobal("gx-ccr-i", g)
	p.SetMessageGlobal("unknown", &fakeGlobal{}) // no such type: ignored
	if p.MessageGlobal("gx-ccr-i") != g || p.MessageGlobal("unknown") != nil {
		t.Fatal("MessageGlobal does not return what was set")
	}
	now := int64(1e18)
	var got []string
	for range 4 {
		ok, limit := p.Decide("peer", "gx-ccr-i", now)
		got = append(got, fmt.Sprintf("%v %s", ok, limit))
	}
	// The overall burst of 2 admits two; the third is refused by overall
	// (its type admission refunded); the fourth again by overall.
	if want := []string{"true ", "true ", "false overall", "false overall"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	if g.refunds != 2 || g.left != 1 {
		t.Errorf("global: %d refunds, %d left; want 2 and 1", g.refunds, g.left)
	}
	g.left = 0
	if ok, limit := p.Decide("peer", "gx-ccr-i", now+int64(10e9)); ok || limit != "gx-ccr-i" {
		t.Errorf("global limit used up: %v %q, want refused by gx-ccr-i", ok, limit)
	}
}
