package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// HangingListener listens on addr ("127.0.0.1:0" for any port) and plays a
// peer that hangs: it accepts connections and reads what they send but
// never answers or closes them. It returns its address and the number of
// connections accepted so far; everything is closed when the test ends.
func HangingListener(t testing.TB, addr string) (string, *atomic.Int64) {
	t.Helper()
	a, c := HangingPeer(t, addr)
	return a, &c.Accepted
}

// HangCounts counts a hanging peer's connections: accepted so far, open
// now (accepted and not yet closed by the client), and the most open at
// once.
type HangCounts struct {
	Accepted, Open, Peak atomic.Int64
}

// HangingPeer is HangingListener with the counts of open connections too.
func HangingPeer(t testing.TB, addr string) (string, *HangCounts) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n HangCounts
	Accept(t, l, func(c net.Conn, _ func(net.Conn)) {
		n.Accepted.Add(1)
		open := n.Open.Add(1)
		for p := n.Peak.Load(); open > p && !n.Peak.CompareAndSwap(p, open); p = n.Peak.Load() {
		}
		go func() {
			io.Copy(io.Discard, c) // returns when the client closes
			n.Open.Add(-1)
		}()
	})
	return l.Addr().String(), &n
}

// Accept serves l until the test ends: handle is called with each
// connection as it is accepted (in the accept loop: anything slow goes on
// a goroutine of its own), and it and every connection handed to
// track (e.g. one the handler dials) are closed, with l, when the test ends.
func Accept(t testing.TB, l net.Listener, handle func(c net.Conn, track func(net.Conn))) {
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			track(c)
			handle(c, track)
		}
	}()
}
