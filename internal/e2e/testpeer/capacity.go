package main

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// capacity is the peer's model of a server with a fixed number of workers
// (-slots): at most that many requests are in service at once and the rest
// wait in arrival order, so its answers slow down as its own concurrency
// grows. A waiting request whose client went away leaves the queue; one in
// service runs to its end, as a real worker's would. Service is -delay of
// waiting and -cpu of busy work, both inside the slot.
type capacity struct {
	slots *slots // nil: no limit
	delay time.Duration
	cpu   time.Duration
}

func newCapacity(slots int, delay, cpu time.Duration) *capacity {
	c := &capacity{delay: delay, cpu: cpu}
	if slots > 0 {
		c.slots = newSlots(slots)
	}
	return c
}

// serve does one request's work; false when its client went away while it
// waited for a slot (nothing is to be answered then).
func (c *capacity) serve(ctx context.Context) bool {
	if c.slots != nil {
		if !c.slots.acquire(ctx) {
			return false
		}
		defer c.slots.release()
	}
	burnCPU(c.cpu)
	time.Sleep(c.delay)
	return true
}

// slots is a counting semaphore whose waiters are served first come, first
// served.
type slots struct {
	mu      sync.Mutex
	free    int
	waiting []chan struct{} // oldest first; closed when granted a slot
}

func newSlots(n int) *slots { return &slots{free: n} }

// acquire takes a slot, waiting behind earlier arrivals; false (and no
// slot held) when ctx ends first.
func (s *slots) acquire(ctx context.Context) bool {
	s.mu.Lock()
	if s.free > 0 && len(s.waiting) == 0 {
		s.free--
		s.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	s.waiting = append(s.waiting, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	for i, w := range s.waiting {
		if w == ch {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			s.mu.Unlock()
			return false
		}
	}
	s.mu.Unlock()
	// Granted while ctx ended: pass the slot on.
	s.release()
	return false
}

// release gives the slot to the oldest waiter, or frees it.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) > 0 {
		close(s.waiting[0])
		s.waiting = s.waiting[1:]
		return
	}
	s.free++
}

// queued is the number of requests waiting for a slot.
func (s *slots) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// burnCPU busy-loops until this thread has used d of CPU time (not of wall
// time: on a shared host a request still costs the same work).
func burnCPU(d time.Duration) {
	if d <= 0 {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	x := uint64(1)
	for threadCPU()-start < d {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	burnSink.Store(x) // the loop is not optimized away
}

var burnSink atomic.Uint64

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}
