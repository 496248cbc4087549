package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// waitQueued waits until n requests wait for a slot.
func waitQueued(t *testing.T, s *slots, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait for a slot, want %d", s.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// One slot, held; b, c and d arrive in that order and wait. c's client goes
// away: it leaves the queue without a slot. Each release then grants the
// oldest waiter: b, then d; and once d is done the slot is free again.
func TestSlotsFIFOAndLeave(t *testing.T) {
	s := newSlots(1)
	if !s.acquire(context.Background()) {
		t.Fatal("a free slot was not granted")
	}
	granted := make(chan string, 3)
	results := make(chan bool, 3)
	cctx, cancel := context.WithCancel(context.Background())
	for i, name := range []string{"b", "c", "d"} {
		ctx := context.Background()
		if name == "c" {
			ctx = cctx
		}
		go func() {
			ok := s.acquire(ctx)
			if ok {
				granted <- name
			}
			results <- ok
		}()
		waitQueued(t, s, i+1)
	}
	cancel()
	select {
	case ok := <-results:
		if ok {
			t.Fatal("a request whose client went away got a slot")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request whose client went away still waits")
	}
	waitQueued(t, s, 2)
	for _, want := range []string{"b", "d"} {
		s.release()
		select {
		case got := <-granted:
			if got != want {
				t.Fatalf("the slot went to %s, want %s (the oldest waiter)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no waiter got the released slot (want %s)", want)
		}
	}
	s.release()
	ctx, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if s.free != 1 || !s.acquire(ctx) {
		t.Fatalf("after every release %d slots are free, want 1 granted at once", s.free)
	}
}

// Many requests on 3 slots, a third of them with clients that give up at
// random times: never more than 3 in service, and no slot lost at the end.
func TestSlotsUnderChurn(t *testing.T) {
	const n = 3
	s := newSlots(n)
	var mu sync.Mutex
	inService, most := 0, 0
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i%3 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(2000))*time.Microsecond)
				defer cancel()
			}
			if !s.acquire(ctx) {
				return
			}
			mu.Lock()
			inService++
			most = max(most, inService)
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			mu.Lock()
			inService--
			mu.Unlock()
			s.release()
		}()
	}
	wg.Wait()
	if most > n {
		t.Errorf("%d requests were in service at once, want at most %d", most, n)
	}
	if s.free != n || s.queued() != 0 {
		t.Errorf("at the end %d slots are free and %d requests wait, want %d and 0", s.free, s.queued(), n)
	}
}

// Four requests of 100 ms each on 2 slots take two rounds.
func TestCapacityServeQueues(t *testing.T) {
	c := newCapacity(2, 100*time.Millisecond, 0)
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if !c.serve(context.Background()) {
				t.Error("a request was not served")
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("4 requests of 100 ms on 2 slots took %v, want at least 200 ms", d)
	}
}

// -cpu is CPU time of the serving thread, not wall time.
func TestBurnCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadCPU()
	burnCPU(20 * time.Millisecond)
	if used := threadCPU() - before; used < 20*time.Millisecond {
		t.Errorf("burnCPU(20ms) used %v of CPU", used)
	}
}
