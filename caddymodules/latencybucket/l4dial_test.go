package latencybucket

import (
	"net"
	"testing"
	"time"

	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// The layer4 connect timer: the proxy's first use of the client connection
// after a pick records the connect; a re-pick before any use (a failed
// dial retried) and a close before use record failures, which count as
// traffic_failure_latency.
func TestDialTimer(t *testing.T) {
	tr, err := pubsel.NewTracker(pubsel.Config{FailureLatency: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "192.0.2.1:443"
	id, _ := tr.Ensure(addr)
	hang, _ := e2e.HangingListener(t, "127.0.0.1:0")
	raw, err := net.Dial("tcp", hang)
	if err != nil {
		t.Fatal(err)
	}
	conn := layer4.WrapConnection(raw, nil, zap.NewNop())
	samples := func() (uint64, time.Duration) {
		tr.Reevaluate(time.Now())
		st := tr.StatusOf(id)
		return st.ObservedSamples, st.ObservedPeak
	}

	armDial(conn, tr, addr)
	if _, ok := conn.Conn.(*dialTimer); !ok {
		t.Fatalf("client connection not wrapped: %T", conn.Conn)
	}
	conn.Write([]byte("a")) // connect 1 recorded (kept to confirm the next)
	armDial(conn, tr, addr)
	conn.Write([]byte("b")) // connect 2: confirms 1
	if n, peak := samples(); n != 1 || peak > time.Second {
		t.Fatalf("after two connects: %d samples, peak %v", n, peak)
	}
	conn.Write([]byte("c")) // no pick pending: nothing recorded
	armDial(conn, tr, addr)
	armDial(conn, tr, addr) // re-pick: the last dial failed
	armDial(conn, tr, addr) // and again: two failures in a row count
	if n, peak := samples(); n != 3 || peak < 2900*time.Millisecond {
		t.Fatalf("after two failed dials: %d samples, peak %v, want about 3s", n, peak)
	}
	conn.Close() // a close before use: failed too
	if n, _ := samples(); n != 4 {
		t.Fatalf("close before use not recorded: %d samples", n)
	}
}

// A proxied layer4 connection counts as in flight to its upstream from its
// connect (the first use after the pick) until the proxy half-closes the
// client side (every upstream side ended) or closes it, exactly once; a
// failed dial never counts.
func TestDialTimerInFlight(t *testing.T) {
	tr, err := pubsel.NewTracker(pubsel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "192.0.2.1:443"
	id, _ := tr.Ensure(addr)
	hang, _ := e2e.HangingListener(t, "127.0.0.1:0")
	open := func() *layer4.Connection {
		raw, err := net.Dial("tcp", hang)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Close() })
		return layer4.WrapConnection(raw, nil, zap.NewNop())
	}
	inFlight := func(want int64, when string) {
		t.Helper()
		if n := tr.LoadOf(id, 0).InFlight; n != want {
			t.Fatalf("%s: %d in flight, want %d", when, n, want)
		}
	}
	a, b := open(), open()
	armDial(a, tr, addr)
	armDial(b, tr, addr)
	inFlight(0, "picked, not connected")
	a.Write([]byte("x"))
	b.Write([]byte("x"))
	inFlight(2, "two connected")
	a.Conn.(*dialTimer).CloseWrite()
	inFlight(1, "one half-closed twice")
	a.Close()
	inFlight(1, "the half-closed one closed")
	b.Close()
	inFlight(0, "both closed")
	c := open()
	armDial(c, tr, addr)
	armDial(c, tr, addr) // the first dial failed
	c.Read(make([]byte, 0))
	inFlight(1, "connected after a retry")
	c.Close()
	inFlight(0, "closed after a retry")
}
