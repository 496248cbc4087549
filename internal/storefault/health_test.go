package storefault

import (
	"errors"
	"testing"
	"time"
)

// The rule: 3 calls in a row without an answer, the first at least 1 s
// before the last, mark the store down, once; an answered call ends the
// run; an error reply never marks it down; Back ends the down state once.
func TestHealthRule(t *testing.T) {
	const failures, after = 3, time.Second
	timeout := &Error{Reason: "timeout", Err: errors.New("i/o timeout")}
	refused := &Error{Reason: "noperm", Answered: true, Err: errors.New("NOPERM")}
	t0 := time.Unix(1000, 0)
	h := NewHealth()
	fail := func(err error, at time.Duration) bool {
		_, down := h.Fail(err, t0.Add(at), failures, after)
		return down
	}
	// Three quick timeouts: not a second apart.
	for i := range 3 {
		if fail(timeout, time.Duration(i)*100*time.Millisecond) {
			t.Fatalf("down after %d timeouts within 200 ms", i+1)
		}
	}
	// An answer ends the run: three more, the first at 1.5 s.
	h.Answered()
	if fail(timeout, 1500*time.Millisecond) || fail(timeout, 2000*time.Millisecond) {
		t.Fatal("down before three calls of the new run")
	}
	// Error replies never count, and never mark it down.
	for range 10 {
		if fail(refused, 2600*time.Millisecond) {
			t.Fatal("an error reply marked the store down")
		}
	}
	if !fail(timeout, 2600*time.Millisecond) || h.Healthy() {
		t.Fatal("the third timeout of a run spanning 1.1 s did not mark it down")
	}
	if fail(timeout, 3*time.Second) {
		t.Fatal("marked down twice")
	}
	if v := h.View(); v.Healthy || v.Downs != 1 || !v.DownSince.Equal(t0.Add(2600*time.Millisecond)) || v.LastReason != "timeout" {
		t.Fatalf("view %+v", v)
	}
	if h.Note(refused, t0.Add(4*time.Second)) != "noperm" || h.View().LastReason != "noperm" {
		t.Fatalf("a noted failure: %+v", h.View())
	}
	if d, ok := h.Back(t0.Add(5 * time.Second)); !ok || d != 2400*time.Millisecond || !h.Healthy() {
		t.Fatalf("back: %v %v", d, ok)
	}
	if _, ok := h.Back(t0.Add(6 * time.Second)); ok {
		t.Fatal("back twice")
	}
	// Back ended the run too: one more timeout is the first of a new one.
	if fail(timeout, 7*time.Second) || fail(timeout, 9*time.Second) || !fail(timeout, 9*time.Second) {
		t.Fatal("the run after Back: want down at its third timeout")
	}
}
