package latencybucket

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// dialTimer times the connect of a proxied layer4 connection. caddy-l4's
// proxy dials the picked upstream right after Select returns and starts
// copying as soon as the dial succeeded: its first use of the client
// connection (a Read or a Write) marks the end of the connect. So the
// time from the pick to that first use is the connect time (plus the
// microseconds of the proxy's own setup). A new pick for the same
// connection before that use (lb_try_duration retrying) or its close
// means the dial failed: that counts as a failure.
//
// From that first use the connection counts as in flight to the upstream
// (for within p2c) until the proxy half-closes the client connection,
// which it does once every upstream side has ended, or the connection is
// closed. A dial that failed never counted: caddy-l4 gives no word when it
// gives up on a connection, so a count begun at the pick could leak.
type dialTimer struct {
	net.Conn
	tracker *pubsel.Tracker
	addr    atomic.Pointer[string]
	start   atomic.Int64 // mono() ns of the pick; 0 once the connect is recorded
	flight  pubsel.Flight
	counted atomic.Bool // flight begun and not yet done
}

// armDial starts timing the connect of conn to addr: it wraps the client
// connection once (TCP only) and re-arms it on a retry.
func armDial(conn *layer4.Connection, tr *pubsel.Tracker, addr string) {
	now := max(int64(mono()), 1)
	if dt, ok := conn.Conn.(*dialTimer); ok {
		dt.settle(true, now) // a pick while the last one is unused: that dial failed
		dt.done()            // a second proxy in the route: the first one is over
		dt.addr.Store(&addr)
		dt.start.Store(now)
		return
	}
	if la := conn.LocalAddr(); la == nil || la.Network() != "tcp" {
		return
	}
	dt := &dialTimer{Conn: conn.Conn, tracker: tr}
	dt.addr.Store(&addr)
	dt.start.Store(now)
	conn.Conn = dt
}

// settle records the pending connect, if any, at now.
func (d *dialTimer) settle(failed bool, now int64) {
	start := d.start.Load()
	if start == 0 || !d.start.CompareAndSwap(start, 0) {
		return
	}
	if failed {
		d.tracker.Observe(*d.addr.Load(), time.Duration(now-start), true)
		return
	}
	d.flight = d.tracker.Begin(*d.addr.Load())
	d.counted.Store(true)
	d.tracker.ObserveFlight(d.flight, time.Duration(now-start), false)
}

// done ends the connection's flight, once.
func (d *dialTimer) done() {
	if d.counted.CompareAndSwap(true, false) {
		d.flight.Done()
	}
}

func (d *dialTimer) Read(p []byte) (int, error) {
	if d.start.Load() != 0 {
		d.settle(false, int64(mono()))
	}
	return d.Conn.Read(p)
}

func (d *dialTimer) Write(p []byte) (int, error) {
	if d.start.Load() != 0 {
		d.settle(false, int64(mono()))
	}
	return d.Conn.Write(p)
}

func (d *dialTimer) Close() error {
	d.settle(true, int64(mono()))
	d.done()
	return d.Conn.Close()
}

// CloseWrite half-closes, as the proxy does to the connection it wraps
// once every upstream side has ended.
func (d *dialTimer) CloseWrite() error {
	d.done()
	if cw, ok := d.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
