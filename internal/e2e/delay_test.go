//go:build linux

package e2e

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"
)

// Delay adds real round-trip time to one destination and none to another:
// a TCP connect (SYN out, SYN/ACK back) from host b to a server in host a,
// which delays what it sends to b by 40 ms, takes at least the delay and
// many times as long as the same connect from host c. Bounds below and
// ratios only: a busy machine may add time, never take it away.
func TestDelayAddsRealRoundTripTime(t *testing.T) {
	tp := NewTopology(t, map[string]int{"a": 1, "b": 2, "c": 3})
	var ln net.Listener
	if err := tp.In("a", func() (err error) { ln, err = net.Listen("tcp", tp.IP("a")+":7000"); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	const delay = 40 * time.Millisecond
	tp.Delay(t, "a", map[string]time.Duration{tp.IP("b") + "/32": delay})

	// connect is the lowest of five connect times from host.
	connect := func(host string) time.Duration {
		dial := tp.Dialer(host, nil)
		var times []time.Duration
		for range 5 {
			start := time.Now()
			c, err := dial(context.Background(), "tcp", tp.IP("a")+":7000")
			if err != nil {
				t.Fatalf("connect from %s: %v", host, err)
			}
			times = append(times, time.Since(start))
			c.Close()
		}
		return slices.Min(times)
	}
	delayed, direct := connect("b"), connect("c")
	t.Logf("TCP connect: %v through the %v delay, %v without (%.0fx)", delayed, delay, direct, float64(delayed)/float64(direct))
	if delayed < delay {
		t.Fatalf("connect through a %v delay took %v", delay, delayed)
	}
	if delayed < 5*direct {
		t.Fatalf("connect through a %v delay took %v, only %.1fx the undelayed %v", delay, delayed, float64(delayed)/float64(direct), direct)
	}
}
