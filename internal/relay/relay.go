// Package relay copies bytes both ways between two connections, for a proxy
// that holds many idle ones: a direction waiting for data holds no buffer.
// It reads in the callback of syscall.RawConn.Read: the callback borrows a
// pooled buffer, reads the socket once without blocking, and gives the
// buffer back if there was nothing to read, so Go's poller does the waiting
// and the same read syscall both finds the bytes and fetches them. A socket
// that must be read through a wrapper (End.Socket without End.Direct) is
// waited on with a one-byte peek instead, and then read through the
// wrapper. An optional Filter sees one direction's bytes before they are
// passed on.
//
// Pipe keeps two goroutines for as long as the connections live. Start
// (Linux) keeps none while both directions are idle: a direction's
// goroutine copies as Pipe does while it has traffic and ends after
// Linger of silence (Prime, for a new connection's first wait), and its
// socket is then watched by an epoll set; with
// Own, a handler whose caller closes the connection on return can hand
// the socket over and return. It knows nothing of Caddy.
package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
)

// BufferSize is the size of the pooled copy buffers. Only connections in the
// middle of a copy hold one, so it can be generous.
const BufferSize = 16 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// A Filter sees the bytes read from one end before they are written to the
// other. Feed returns how many bytes at the start of b may be written now;
// the rest are kept, and handed to Feed again at the start of b with what is
// read next after them. An error stops the relay once the bytes Feed passed
// with it are written: nothing after them is.
type Filter interface {
	Feed(b []byte) (int, error)
}

// An End is one connection of a relay.
type End struct {
	Conn net.Conn
	// Socket is the socket beneath Conn when Conn wraps it (a caddy-l4
	// connection, say): it is waited on for readability and half-closed.
	// Without one, Conn is used if it is a *net.TCPConn or like it;
	// otherwise reads block holding a buffer.
	Socket syscall.Conn
	// Buffered, if set, counts bytes Conn holds that Socket will not
	// signal, such as bytes read ahead; they are read without waiting.
	Buffered func() int
	// Direct, with Socket, reads Socket itself whenever Buffered reports
	// nothing, rather than Conn: one syscall per read instead of a peek
	// and a read. Only for a Conn whose Read adds nothing to the socket's
	// bytes but the ones Buffered counts (caddy-l4's Connection after
	// matching; not TLS): Conn's own Read then sees only those, and a
	// wrapper's byte counts miss the rest. A Conn that is itself the
	// socket (a *net.TCPConn) is always read so.
	Direct bool
	// Filter, if set, sees what is read from Conn.
	Filter Filter
}

// Pipe relays between a and b until both directions have ended or one has
// failed. A direction ends at its source's EOF: the other end is
// half-closed (CloseWrite) to pass the EOF on, and the opposite direction
// goes on until it ends too. A failure (an error reading, writing or from a
// Filter) closes both connections and is returned; otherwise the caller
// closes them.
func Pipe(a, b End) error {
	p := &pipe{a: a.Conn, b: b.Conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(a, b)
	}()
	p.run(b, a)
	<-done
	return p.err
}

type pipe struct {
	a, b net.Conn
	once sync.Once
	err  error
}

func (p *pipe) run(dst, src End) {
	err := copyTo(dst, src)
	if err == nil {
		return
	}
	// Closing both stops the other direction, which may be idle; its error
	// then is only a consequence.
	p.once.Do(func() {
		if err != errEnded {
			p.err = err
		}
		p.a.Close()
		p.b.Close()
	})
}

// copyTo copies src to dst until src's EOF or an error.
func copyTo(dst, src End) error {
	w := newWaiter(src)
	d := &direction{dst: dst, src: src}
	more := false // the last read filled the buffer: read again without waiting
	for {
		var bp *[]byte
		var k, n int
		var rerr error
		switch {
		case w.buffered != nil && w.buffered() > 0, w.raw == nil:
			bp, k = borrow(d.held)
			n, rerr = src.Conn.Read((*bp)[k:])
		case w.direct:
			var err error
			if bp, k, n, rerr, err = w.read(d.held); err != nil {
				return err
			}
		default:
			if !more {
				if err := w.wait(); err != nil {
					return err
				}
			}
			bp, k = borrow(d.held)
			n, rerr = src.Conn.Read((*bp)[k:])
		}
		more = k+n == len(*bp)
		if ended, err := d.pass(bp, k, n, rerr); ended {
			return err
		}
	}
}

// A direction is one way of a relay, and what its Filter holds back
// between reads.
type direction struct {
	dst, src End
	held     []byte
}

// pass writes on what one read brought (*bp holds d.held, k bytes, then
// the n bytes read), keeps what the Filter holds back, and gives the
// buffer back. It reports whether the direction has ended, and how: nil
// for an EOF passed on, errEnded for one that could not be, else the
// failure.
func (d *direction) pass(bp *[]byte, k, n int, rerr error) (bool, error) {
	out, ferr := d.take(bp, k, n)
	var werr error
	if len(out) > 0 {
		_, werr = d.dst.Conn.Write(out)
	}
	giveBack(bp)
	return d.after(ferr, rerr, werr)
}

// take runs one read's bytes (*bp holds d.held, k bytes, then the n bytes
// read) through the Filter: it returns the bytes to write now (still in
// *bp) and the Filter's error, and keeps what the Filter holds back.
// What the Filter passed goes on even when it refuses what follows: the
// messages before a refused one are whole and good.
func (d *direction) take(bp *[]byte, k, n int) ([]byte, error) {
	data := (*bp)[:k+n]
	fwd := len(data)
	var err error
	if d.src.Filter != nil {
		fwd = 0 // held bytes go nowhere unless the Filter passes them
		if n > 0 {
			fwd, err = d.src.Filter.Feed(data)
		}
	}
	if d.held = append(d.held[:0], data[fwd:]...); len(d.held) == 0 {
		d.held = nil // an idle connection holds nothing
	}
	return data[:fwd], err
}

// after says, once take's bytes are written, whether the direction has
// ended and how (see pass).
func (d *direction) after(ferr, rerr, werr error) (bool, error) {
	err := ferr
	if err == nil {
		err = werr
	}
	switch {
	case err != nil:
		return true, err
	case rerr == io.EOF && len(d.held) > 0:
		return true, io.ErrUnexpectedEOF
	case rerr == io.EOF:
		return true, closeWrite(d.dst)
	case rerr != nil:
		return true, rerr
	}
	return false, nil
}

// borrow returns a buffer with held copied to its start, and held's
// length: a pooled one, unless held is a long message held back whole.
func borrow(held []byte) (*[]byte, int) {
	var bp *[]byte
	if 2*len(held) > BufferSize {
		b := make([]byte, 2*len(held))
		bp = &b
	} else {
		bp = buffers.Get().(*[]byte)
	}
	return bp, copy(*bp, held)
}

// giveBack returns a pooled buffer to the pool.
func giveBack(bp *[]byte) {
	if len(*bp) == BufferSize {
		buffers.Put(bp)
	}
}

// closeWrite passes an EOF on to dst's peer.
func closeWrite(dst End) error {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := dst.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	if cw, ok := dst.Socket.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errEnded
}

// errEnded ends the relay without an error: an EOF that cannot be passed on
// alone closes both connections.
var errEnded = errors.New("relay: ended")

// A waiter waits until an End has something to read, without a buffer,
// and reads it directly where it can.
type waiter struct {
	raw      syscall.RawConn // nil: don't wait, the read blocks
	direct   bool            // read raw in the poller's callback (readDirect)
	buffered func() int
	peek     [1]byte
	ready    func(fd uintptr) bool // w.readable, bound once: waiting allocates nothing
	fill     func(fd uintptr) bool // w.readDirect, bound once
	err      error                 // what the peek or read found wrong

	// A direct read's state, between w.read and its callback.
	held []byte
	bp   *[]byte
	k, n int
}

func newWaiter(e End) *waiter {
	w := &waiter{buffered: e.Buffered}
	sc := e.Socket
	w.direct = canReadDirect && (sc == nil || e.Direct)
	if sc == nil {
		sc, _ = e.Conn.(syscall.Conn)
	}
	if sc != nil {
		w.raw, _ = sc.SyscallConn()
	}
	w.direct = w.direct && w.raw != nil
	w.ready = w.readable
	w.fill = w.readDirect
	return w
}

func (w *waiter) wait() error {
	if w.raw == nil || w.buffered != nil && w.buffered() > 0 {
		return nil
	}
	if err := w.raw.Read(w.ready); err != nil {
		return err
	}
	// A peek that finds a connection reset takes the error: the read after
	// it would see a clean EOF.
	err := w.err
	w.err = nil
	return err
}

// read waits in the poller until the socket has bytes, EOF or an error,
// and reads once: a buffer holding held and then n bytes read (k =
// len(held)), and the read's error (io.EOF at the end). err is the
// wait's own error (the connection closed): then there is no buffer.
func (w *waiter) read(held []byte) (bp *[]byte, k, n int, rerr, err error) {
	w.held = held
	err = w.raw.Read(w.fill)
	bp, k, n, rerr = w.bp, w.k, w.n, w.err
	w.held, w.bp, w.n, w.err = nil, nil, 0, nil
	if err != nil && bp != nil {
		giveBack(bp)
		bp = nil
	}
	return bp, k, n, rerr, err
}
