package peakewma

import (
	"sync"
	"testing"
	"time"
)

const ms = time.Millisecond

const hl = 10 * time.Second

func feed(e *EWMA, now *int64, step time.Duration, ds ...time.Duration) {
	for _, d := range ds {
		*now += int64(step)
		e.Observe(d)
		e.Value(*now, hl, 0) // fold each sample on its own: tower's per-sample rule
	}
}

func near(a, b time.Duration) bool {
	d := a - b
	return d > -50*time.Microsecond && d < 50*time.Microsecond
}

func TestPeakRisesAtOnceOnConfirmedSlowAnswers(t *testing.T) {
	var e EWMA
	now := int64(1e18)
	feed(&e, &now, ms, 5*ms, 5*ms, 5*ms)
	if avg, peak, n := e.Value(now, hl, 0); n != 2 || !near(avg, 5*ms) || !near(peak, 5*ms) {
		t.Fatalf("fast: avg %v peak %v n %d", avg, peak, n)
	}
	feed(&e, &now, ms, 500*ms, 500*ms) // two in a row: confirmed
	if _, peak, _ := e.Value(now, hl, 0); !near(peak, 500*ms) {
		t.Fatalf("peak after two slow answers: %v, want 500ms at once", peak)
	}
}

// The one-slow-request rule: a single slow answer among fast ones moves
// neither figure.
func TestOneSlowAnswerCountsAsFast(t *testing.T) {
	var e EWMA
	now := int64(1e18)
	feed(&e, &now, ms, 5*ms, 5*ms, 10*time.Second, 5*ms, 5*ms)
	if avg, peak, _ := e.Value(now, hl, 0); !near(avg, 5*ms) || !near(peak, 5*ms) {
		t.Fatalf("after one slow answer: avg %v peak %v, want 5ms", avg, peak)
	}
}

// The peak decays towards new samples with the half-life: one half-life
// after a 500 ms peak, fed 5 ms answers, half the excess remains.
func TestPeakDecaysWithHalfLife(t *testing.T) {
	var e EWMA
	now := int64(1e18)
	feed(&e, &now, ms, 500*ms, 500*ms, 500*ms)
	feed(&e, &now, hl/2, 5*ms) // min(5, 500) = 5 after half a half-life...
	feed(&e, &now, hl/2, 5*ms) // ...and another: one half-life in all
	want := 5*ms + (495*ms)/2
	if _, peak, _ := e.Value(now, hl, 0); peak < want-ms || peak > want+ms {
		t.Fatalf("peak one half-life later: %v, want ~%v", peak, want)
	}
}

// Idle, the figures decay towards the floor (the probe latency).
func TestValueDecaysTowardsFloorWhenIdle(t *testing.T) {
	var e EWMA
	now := int64(1e18)
	feed(&e, &now, ms, 400*ms, 400*ms)
	avg, peak, _ := e.Value(now+int64(2*hl), hl, 100*ms)
	if want := 100*ms + 300*ms/4; !near(peak, want) || !near(avg, want) {
		t.Fatalf("two half-lives idle: avg %v peak %v, want %v", avg, peak, want)
	}
	if _, peak, _ := e.Value(now, hl, time.Second); peak != 400*ms {
		t.Fatalf("a floor above the figure leaves it: %v", peak)
	}
}

func TestEmptyAndReset(t *testing.T) {
	var e EWMA
	if _, _, n := e.Value(1, hl, 0); n != 0 {
		t.Fatal("empty has samples")
	}
	e.Observe(ms)
	if _, _, n := e.Value(1, hl, 0); n != 0 {
		t.Fatal("a single sample is not confirmed yet")
	}
	e.Observe(ms)
	e.Reset()
	if _, _, n := e.Value(3, hl, 0); n != 0 {
		t.Fatal("reset kept samples")
	}
}

// Samples recorded between two folds are folded together: the average
// moves towards their mean, and the highest of them is the peak at once.
func TestFoldOfABatch(t *testing.T) {
	var e EWMA
	now := int64(1e18)
	feed(&e, &now, ms, 10*ms, 10*ms)
	for _, d := range []time.Duration{10 * ms, 40 * ms, 40 * ms, 20 * ms, 20 * ms} {
		e.Observe(d) // confirmed: 10, 10, 40, 20, 20 (mean 20)
	}
	now += int64(hl)
	avg, peak, n := e.Value(now, hl, 0)
	if n != 6 || !near(avg, 15*ms) || !near(peak, 40*ms) {
		t.Fatalf("avg %v peak %v n %d, want avg 15ms (halfway from 10 to the mean 20), peak 40ms, 6 samples", avg, peak, n)
	}
	if _, _, n := e.Value(now+1, hl, 0); n != 6 {
		t.Fatalf("an empty fold counted samples: %d", n)
	}
}

// Concurrent observers and one folder (run with -race) keep the figures
// within the samples' range and lose no sample.
func TestConcurrentObserve(t *testing.T) {
	var e EWMA
	var wg sync.WaitGroup
	stop := make(chan struct{})
	folded := make(chan int64)
	go func() { // the owner folds on its own schedule meanwhile
		for now := int64(1e18); ; now += int64(ms) {
			select {
			case <-stop:
				folded <- now
				return
			default:
				e.Value(now, hl, 0)
			}
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				e.Observe(time.Duration(1+g) * ms)
			}
		}()
	}
	wg.Wait()
	close(stop)
	last := <-folded
	avg, peak, n := e.Value(last, hl, 0)
	if n != 3999 || avg < ms || avg > 4*ms || peak < ms || peak > 4*ms {
		t.Fatalf("avg %v peak %v n %d (want 3999 samples: all but the first)", avg, peak, n)
	}
}

func BenchmarkObserve(b *testing.B) {
	var e EWMA
	b.ReportAllocs()
	for b.Loop() {
		e.Observe(5 * ms)
	}
}

func BenchmarkObserveParallel(b *testing.B) {
	var e EWMA
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Observe(5 * ms)
		}
	})
}
