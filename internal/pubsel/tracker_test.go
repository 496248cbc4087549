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
