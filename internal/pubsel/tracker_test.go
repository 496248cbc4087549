package pubsel

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// The background prober measures a live listener, marks a closed port
// inactive, reports each round, and stops when told.
func TestTrackerProbesInBackgroundAndStops(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()

	var rounds atomic.Int64
	tr := newTracker(t, Config{Interval: 20 * ms, Timeout: time.Second,
		OnRound: func(string, latency.Result) { rounds.Add(1) }})
	live, _ := tr.Ensure(l.Addr().String())
	tr.Start()
	dead, _ := tr.Ensure(closedAddr) // added after Start: probed too
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, b := tr.StatusOf(live), tr.StatusOf(dead)
		if a.Rounds >= 3 && b.Rounds >= 3 {
			if !a.Active || !a.Measured || a.Bucket != 0 || a.LastError != "" {
				t.Fatalf("live listener: %+v", a)
			}
			if b.Active || b.Measured || b.LastError == "" {
				t.Fatalf("closed port: %+v", b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probing stalled: %+v %+v", a, b)
		}
		time.Sleep(10 * ms)
	}
	tr.Stop()
	after := rounds.Load()
	time.Sleep(100 * ms)
	if rounds.Load() != after {
		t.Fatal("probing went on after Stop")
	}
	if _, err := tr.Ensure("x:1"); err != nil {
		t.Fatal(err)
	}
}

func TestMaxTargetsBound(t *testing.T) {
	tr := newTracker(t, Config{MaxTargets: 2})
	tr.Ensure("a:1")
	tr.Ensure("b:1")
	if _, err := tr.Ensure("c:1"); err != ErrTooManyTargets {
		t.Fatalf("third target: %v", err)
	}
	if id, err := tr.Ensure("a:1"); err != nil || id != 0 {
		t.Fatalf("known target: %d %v", id, err)
	}
}

// The cold-start rule: until the window is full a publisher is placed by
// its current minimum alone, so a noisy first round (35 ms for a 30 ms
// publisher) does not hold it in [32,64) under hysteresis; once the window
// is full, hysteresis keeps a publisher in its bucket near a boundary.
func TestColdStartRule(t *testing.T) {
	tr := newTracker(t, Config{Window: 3})
	measure(t, tr, "a:1", 35*ms)
	if st := tr.StatusOf(0); st.Bucket != 1 || st.Window != 1 {
		t.Fatalf("first round: %+v", st)
	}
	measure(t, tr, "a:1", 30*ms) // within [32,64)'s widened band, but the window is not full
	if st := tr.StatusOf(0); st.Bucket != 0 || st.Label != "[0,32)" {
		t.Fatalf("second round at 30 ms left it in %s", st.Label)
	}

	// Full window: the rule holds a publisher at its bucket's edge.
	measure(t, tr, "b:1", 40*ms)
	measure(t, tr, "b:1", 33*ms)
	measure(t, tr, "b:1", 34*ms) // full: min 33, bucket [32,64)
	for range 3 {
		measure(t, tr, "b:1", 31*ms) // 31 ms: within 10 % of 32
	}
	if st := tr.StatusOf(1); st.Bucket != 1 || st.Latency != 31*ms {
		t.Fatalf("full window at 31 ms: %+v", st)
	}
	measure(t, tr, "b:1", 20*ms) // far outside the band: moves at once
	if st := tr.StatusOf(1); st.Bucket != 0 {
		t.Fatalf("at 20 ms: %+v", st)
	}
}

// listener accepts and closes connections, counting them.
func listener(t *testing.T) (string, *atomic.Int64, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), &n, func() { l.Close() }
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * ms)
	}
}

func statusOf(tr *Tracker, addr string) (Status, bool) {
	for _, st := range tr.Statuses() {
		if st.Addr == addr {
			return st, true
		}
	}
	return Status{}, false
}

// Two holders (config generations) share targets: releasing one stops
// probing only the targets no other holder has, and the others go on with
// their measurements. A target added later is probed at once.
func TestHoldersShareTargets(t *testing.T) {
	a, na, ca := listener(t)
	defer ca()
	b, nb, cb := listener(t)
	defer cb()
	c, _, cc := listener(t)
	defer cc()
	tr := newTracker(t, Config{Interval: 30 * ms, Probes: 1})
	tr.Start()
	defer tr.Stop()
	h1, h2 := tr.Hold(), tr.Hold()
	idA, _ := h1.Ensure(a)
	h1.Ensure(b)
	h2.Ensure(b)
	waitFor(t, "a and b measured twice", func() bool {
		sa, _ := statusOf(tr, a)
		sb, _ := statusOf(tr, b)
		return sa.Rounds >= 2 && sb.Rounds >= 2
	})
	var removed []uint32
	h1.Release(func(id uint32) { removed = append(removed, id) })
	if len(removed) != 1 || removed[0] != idA {
		t.Fatalf("removed ids %v, want [%d]", removed, idA)
	}
	if _, ok := statusOf(tr, a); ok {
		t.Fatal("a is still listed after its last holder let go")
	}
	sb, _ := statusOf(tr, b)
	// Probing a stops (one round may have been under way); b's goes on
	// with its rounds counted from before.
	time.Sleep(50 * ms)
	before := na.Load()
	waitFor(t, "b probed further", func() bool { s, _ := statusOf(tr, b); return s.Rounds >= sb.Rounds+3 })
	if na.Load() != before {
		t.Fatalf("a probed %d more times after release", na.Load()-before)
	}
	if nb.Load() < 5 {
		t.Fatalf("b probed %d times", nb.Load())
	}
	// A new target is probed at once; the freed id is reused.
	idC, _ := h2.Ensure(c)
	if idC != idA {
		t.Fatalf("new target got id %d, want the freed %d", idC, idA)
	}
	waitFor(t, "c measured", func() bool { s, _ := statusOf(tr, c); return s.Measured })
	if _, err := h1.Ensure(a); err != ErrReleased {
		t.Fatalf("Ensure after Release: %v", err)
	}
	// A released holder still finds what others hold (its config's last
	// requests keep their pins), without holding it.
	if id, err := h1.Ensure(b); err != nil || id != sb.ID {
		t.Fatalf("released holder looking up b: %d %v", id, err)
	}
}

// Apply re-applies settings to the kept measurements.
func TestApplyKeepsComparableMeasurements(t *testing.T) {
	tr := newTracker(t, Config{Window: 3, ProbeID: "http /probe"})
	for _, d := range []time.Duration{50 * ms, 20 * ms, 40 * ms} {
		measure(t, tr, "a:1", d)
	}
	if st := tr.StatusOf(0); st.Latency != 20*ms || st.Bucket != 0 || st.Rounds != 3 {
		t.Fatalf("before: %+v", st)
	}
	// A narrower bucket places it afresh from the kept window at once.
	cfg := tr.Config()
	cfg.BucketWidth = 16 * ms
	if err := tr.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if st := tr.StatusOf(0); st.Bucket != 1 || st.Label != "[16,32)" || st.Rounds != 3 || !st.Measured {
		t.Fatalf("after bucket_width 16ms: %+v", st)
	}
	// A segment adds to it at once.
	cfg.Segments = map[string]time.Duration{"a:1": 20 * ms}
	tr.Apply(cfg)
	if st := tr.StatusOf(0); st.Latency != 40*ms || st.Bucket != 2 {
		t.Fatalf("after a segment: %+v", st)
	}
	// A shorter window drops the oldest rounds: the 20 ms round goes.
	cfg.Segments, cfg.Window = nil, 1
	tr.Apply(cfg)
	if st := tr.StatusOf(0); st.Latency != 40*ms || st.Window != 1 {
		t.Fatalf("after window 1: %+v", st)
	}
	// Another probe measures something else: everything is forgotten.
	cfg.ProbeID = "tcp"
	tr.Apply(cfg)
	if st := tr.StatusOf(0); st.Measured || st.Bucket != latency.Unmeasured || st.Rounds != 0 || !st.Active {
		t.Fatalf("after a new probe: %+v", st)
	}
	// A round begun under the old probe is discarded.
	if tr.record((*tr.byID.Load())[0], latency.Result{RTTs: []time.Duration{ms}, Best: ms, OK: 1}, time.Now(), tr.epoch.Load()-1) {
		t.Fatal("a round of the old probe was recorded")
	}
}
