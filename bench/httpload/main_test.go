package main

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// A server that answers one request at a time, 20 ms each (50/s), offered
// 100/s for 1 s: an open loop still sends about 100 requests, and the last
// ones wait behind the queue for about 1 s past their scheduled send time
// (a closed loop would send 50 and see 20 ms).
func TestRunHoldsTheRate(t *testing.T) {
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		time.Sleep(20 * time.Millisecond)
		mu.Unlock()
	}))
	defer srv.Close()
	lat, _, errs := run(srv.URL, 100, time.Second, 10*time.Second)
	if len(errs) > 0 {
		t.Fatalf("%d errors: %v", len(errs), errs[0])
	}
	if len(lat) < 80 || len(lat) > 101 {
		t.Errorf("%d requests sent in 1 s at 100/s", len(lat))
	}
	if m := slices.Max(lat); m < 600*time.Millisecond {
		t.Errorf("the slowest latency is %v, want the queue's wait (about 1 s) counted", m)
	}
}

// Answers outside 2xx are failures.
func TestRunCountsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	lat, _, errs := run(srv.URL, 50, 200*time.Millisecond, 10*time.Second)
	if len(lat) == 0 || len(errs) != len(lat) {
		t.Errorf("%d of %d answers 503 counted as failures", len(errs), len(lat))
	}
}
