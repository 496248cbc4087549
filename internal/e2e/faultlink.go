package e2e

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// FaultyLink is a TCP relay in a test's path to a server, for faults of one
// client's link alone: it passes bytes both ways, or holds each for a
// delay (a link slower than the client's deadlines: the bytes the client
// sent still arrive), or resets the client's connections. Set the fault
// at any time; it applies to the bytes relayed from then on.
type FaultyLink struct {
	addr  string
	delay atomic.Int64 // ns each chunk is held, each way
	// resetOn: the client's connection is reset (RST) when it sends
	// bytes holding this, every other time after passing them on.
	resetOn atomic.Pointer[[]byte]
	resets  atomic.Int64
}

// Addr is where clients connect.
func (l *FaultyLink) Addr() string { return l.addr }

// Pass ends the fault.
func (l *FaultyLink) Pass() { l.delay.Store(0); l.resetOn.Store(nil) }

// Delay holds every chunk for d, each way.
func (l *FaultyLink) Delay(d time.Duration) { l.delay.Store(int64(d)) }

// ResetOn resets the client's connection whenever it sends bytes holding
// marker, in any case (e.g. the command of the request to cut): every other such
// request reaches the server first (the reset hits the answer), the others
// do not (it hits the request).
func (l *FaultyLink) ResetOn(marker string) { b := bytes.ToLower([]byte(marker)); l.resetOn.Store(&b) }

// StartFaultyLink listens on listen (in the caller's network namespace,
// e.g. inside Topology.In) and relays each connection to target, dialed
// by dial. Everything is closed when the test ends.
func StartFaultyLink(t testing.TB, ln net.Listener, target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *FaultyLink {
	l := &FaultyLink{addr: ln.Addr().String()}
	Accept(t, ln, func(c net.Conn, track func(net.Conn)) {
		go func() {
			s, err := dial(context.Background(), "tcp", target)
			if err != nil {
				c.Close()
				return
			}
			track(s)
			go l.pipe(s, c, nil)
			l.pipe(c, s, c.(*net.TCPConn))
		}()
	})
	return l
}

// pipe copies from src to dst in order, each chunk held for the delay in
// force when it was read. client is the client's connection when src is
// it (the direction a reset is decided on).
func (l *FaultyLink) pipe(src, dst net.Conn, client *net.TCPConn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range q {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer close(q)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			if m := l.resetOn.Load(); client != nil && m != nil && bytes.Contains(bytes.ToLower(b), *m) {
				// The reset first, so that no answer reaches the client;
				// the request then goes on (the writer ends with it).
				client.SetLinger(0)
				client.Close() // RST
				if l.resets.Add(1)%2 == 0 {
					q <- chunk{b, time.Now()}
				}
				return
			}
			q <- chunk{b, time.Now().Add(time.Duration(l.delay.Load()))}
		}
		if err != nil {
			return
		}
	}
}
