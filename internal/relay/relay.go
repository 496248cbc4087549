// Package relay copies bytes both ways between two connections, for a proxy
// that holds many idle ones: a direction waiting for data holds no buffer.
// It waits for the socket to become readable (syscall.RawConn.Read with a
// callback that peeks one byte, so Go's poller does the waiting) and only
// then borrows a pooled buffer for the copy. An optional Filter sees one
// direction's bytes before they are passed on. It knows nothing of Caddy.
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
	var held []byte // what the Filter kept back, between reads
	more := false   // the last read filled the buffer: read again without waiting
	for {
		if !more {
			if err := w.wait(); err != nil {
				return err
			}
		}
		bp := buffers.Get().(*[]byte)
		buf := *bp
		if 2*len(held) > len(buf) {
			buf = make([]byte, 2*len(held)) // a long message held back whole
		}
		k := copy(buf, held)
		n, rerr := src.Conn.Read(buf[k:])
		more = k+n == len(buf)
		data := buf[:k+n]
		fwd := len(data)
		var err error
		if src.Filter != nil {
			fwd = 0 // held bytes go nowhere unless the Filter passes them
			if n > 0 {
				fwd, err = src.Filter.Feed(data)
			}
		}
		if fwd > 0 {
			// What the Filter passed goes on even when it refuses what
			// follows: the messages before a refused one are whole and good.
			if _, werr := dst.Conn.Write(data[:fwd]); err == nil {
				err = werr
			}
		}
		if held = append(held[:0], data[fwd:]...); len(held) == 0 {
			held = nil // an idle connection holds nothing
		}
		buffers.Put(bp)
		switch {
		case err != nil:
			return err
		case rerr == io.EOF && len(held) > 0:
			return io.ErrUnexpectedEOF
		case rerr == io.EOF:
			return closeWrite(dst)
		case rerr != nil:
			return rerr
		}
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

// A waiter waits until an End has something to read, without a buffer.
type waiter struct {
	raw      syscall.RawConn // nil: don't wait, the read blocks
	buffered func() int
	peek     [1]byte
	ready    func(fd uintptr) bool // w.readable, bound once: waiting allocates nothing
	err      error                 // what the peek found wrong
}

func newWaiter(e End) *waiter {
	w := &waiter{buffered: e.Buffered}
	sc := e.Socket
	if sc == nil {
		sc, _ = e.Conn.(syscall.Conn)
	}
	if sc != nil {
		w.raw, _ = sc.SyscallConn()
	}
	w.ready = w.readable
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
