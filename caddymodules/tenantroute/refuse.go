package tenantroute

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

// A bind refused on a routed connection (its node at max_per_node, README
// "max_per_node") must not reach the node, and the client must have its
// answer, LDAP busy, between two of the node's messages. The relay's filters
// only say how much of what they saw may pass, so the two ends the relay
// writes to are wrapped: nodeConn leaves the refused binds out of what goes
// to the node, clientConn writes the router's answers to the client where
// the node's stream is between messages.

// maxAnswersQueued bounds the router's answers waiting for the node's
// stream to reach the end of a message: a client that sends more refused
// binds meanwhile is disconnected.
const maxAnswersQueued = 16

var (
	errTooManyAnswers = errors.New("tenant_route: too many refused binds waiting for an answer")
	errNoHalfClose    = errors.New("tenant_route: the connection cannot be half-closed")
)

// wrapped gives a wrapper the socket methods the relay looks for
// (syscall.Conn to wait on it, CloseWrite to pass an EOF on), from the
// connection it wraps or, failing that, the socket beneath it.
type wrapped struct {
	net.Conn
	socket syscall.Conn // nil: Conn's own
}

func (w *wrapped) SyscallConn() (syscall.RawConn, error) {
	sc, ok := w.Conn.(syscall.Conn)
	if !ok {
		sc = w.socket
	}
	if sc == nil {
		return nil, errors.New("tenant_route: no socket")
	}
	return sc.SyscallConn()
}

func (w *wrapped) CloseWrite() error {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := w.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	if cw, ok := w.socket.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errNoHalfClose
}

// nodeConn is the node's connection as the relay writes the client's bytes
// to it: without the spans the guard refused. The guard's Feed and the
// Write of what it passed run one after the other in the same goroutine
// (the relay's client-to-node direction), so the spans are offsets into
// the bytes written next.
type nodeConn struct {
	wrapped
	guard *ldapwire.TenantGuard
}

func (c *nodeConn) Write(b []byte) (int, error) {
	cuts := c.guard.Refused
	if len(cuts) == 0 {
		return c.Conn.Write(b)
	}
	c.guard.Refused = cuts[:0]
	at := 0
	for _, s := range append(cuts, ldapwire.Span{Start: len(b), End: len(b)}) {
		if s.Start > at {
			if n, err := c.Conn.Write(b[at:s.Start]); err != nil {
				return at + n, err
			}
		}
		at = s.End
	}
	return len(b), nil
}

// clientConn is the client's connection as the relay writes the node's
// bytes to it, with the router's own answers put in where the node's
// stream is between messages (the node-to-client filter, a
// ldapwire.BindWatcher, tells: its Feed runs just before the Write of what
// it passed, in the same goroutine). Writes to the client are one at a time
// (mu); an answer never waits for a write: it is queued, and whoever holds
// mu writes the queue out, at the end of a node's message, before letting
// go (drain).
type clientConn struct {
	wrapped
	watcher *ldapwire.BindWatcher

	mu     sync.Mutex // held while writing to the client
	inside bool       // what was written ends inside a node's message; under mu

	qmu    sync.Mutex
	queue  [][]byte // answers not yet written
	queued atomic.Int32
}

func (c *clientConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	n, err := c.Conn.Write(b)
	if c.inside = n < len(b) || !c.watcher.Between(); !c.inside {
		c.flush()
	}
	c.mu.Unlock()
	c.drain()
	return n, err
}

// answer writes the router's message m to the client: now if the node's
// stream is between messages and nothing else is being written, else as
// soon as both are so.
func (c *clientConn) answer(m []byte) error {
	c.qmu.Lock()
	if len(c.queue) >= maxAnswersQueued {
		c.qmu.Unlock()
		return errTooManyAnswers
	}
	c.queue = append(c.queue, m)
	c.queued.Add(1)
	c.qmu.Unlock()
	c.drain()
	return nil
}

// drain writes the queue out if nobody is writing and the stream is
// between messages. An answer queued while another holds mu is written by
// that holder: it drains after letting go, and the answer was queued
// before its TryLock failed.
func (c *clientConn) drain() {
	for c.queued.Load() > 0 && c.mu.TryLock() {
		if !c.inside {
			c.flush()
		}
		inside := c.inside
		c.mu.Unlock()
		if inside {
			return // the node's next write ends its message and writes the queue
		}
	}
}

// flush writes the queued answers; c.mu is held.
func (c *clientConn) flush() {
	if c.queued.Load() == 0 {
		return
	}
	c.qmu.Lock()
	q := c.queue
	c.queue = nil
	c.queued.Store(0)
	c.qmu.Unlock()
	for _, m := range q {
		if _, err := c.Conn.Write(m); err != nil {
			return // the relay finds the connection broken at its next read or write
		}
	}
}
