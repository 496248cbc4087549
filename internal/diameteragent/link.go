package diameteragent

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// outboxSize bounds the messages queued for one connection's writer. A
// connection whose peer stops reading fills it; the agent then treats the
// peer as busy (3004) instead of blocking on it.
const outboxSize = 4096

// writeBatch is the most bytes the writer gathers into one write.
const writeBatch = 64 << 10

// link is one Diameter connection, upstream or downstream: a writer
// goroutine fed by a bounded queue (so no routing decision waits on a
// slow peer, and a burst goes out in one write), and the table of the
// requests the agent forwarded on it that await an answer, by the
// Hop-by-Hop id the agent gave them on this connection.
type link struct {
	conn net.Conn
	out  chan []byte // a nil message closes the connection once written up to it
	done chan struct{}
	once sync.Once

	dprSent atomic.Bool // the agent sent a DPR: its DPA ends the connection

	mu      sync.Mutex
	pending map[uint32]*pending
	nextHbh uint32
	closed  bool
	count   atomic.Int32 // len(pending), read without the lock
}

func newLink(conn net.Conn) *link {
	l := &link{conn: conn, out: make(chan []byte, outboxSize), done: make(chan struct{}),
		pending: map[uint32]*pending{}, nextHbh: rand.Uint32()}
	go l.writeLoop()
	return l
}

// send queues msg; false if the queue is full or the link closed.
func (l *link) send(msg []byte) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.out <- msg:
		return true
	default:
		return false
	}
}

// closeAfterQueued closes the connection once what is queued is written
// (a DPA, then the end), or after grace if the peer does not read it.
func (l *link) closeAfterQueued(c Clock, grace time.Duration) {
	select {
	case l.out <- nil:
		c.AfterFunc(grace, l.close)
	default:
		l.close()
	}
}

// disconnect sends the agent's DPR and closes the connection when the DPA
// comes (the reader sees it: dprSent), or after grace (RFC 6733 §5.4: the
// DPR's sender closes the connection once it has the answer).
func (l *link) disconnect(dpr []byte, c Clock, grace time.Duration) {
	l.dprSent.Store(true)
	if !l.send(dpr) {
		l.close()
		return
	}
	c.AfterFunc(grace, l.close)
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		l.conn.Close()
	})
}

func (l *link) writeLoop() {
	buf := make([]byte, 0, writeBatch)
	for {
		var msg []byte
		select {
		case <-l.done:
			return
		case msg = <-l.out:
		}
		buf = append(buf[:0], msg...)
		end := msg == nil
	gather:
		for !end && len(buf) < writeBatch {
			select {
			case m := <-l.out:
				if m == nil {
					end = true
				}
				buf = append(buf, m...)
			default:
				break gather
			}
		}
		if len(buf) > 0 {
			if _, err := l.conn.Write(buf); err != nil {
				l.close()
				return
			}
		}
		if end {
			l.close()
			return
		}
	}
}

type forwardResult int

const (
	sent forwardResult = iota
	full
	closed
)

// add records p as awaiting an answer on l under a fresh Hop-by-Hop id,
// unless l holds limit requests already (full) or is closed.
func (l *link) add(p *pending, limit int) (uint32, forwardResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return 0, closed
	case len(l.pending) >= limit:
		return 0, full
	}
	for {
		l.nextHbh++
		if _, taken := l.pending[l.nextHbh]; !taken {
			break
		}
	}
	l.pending[l.nextHbh] = p
	l.count.Store(int32(len(l.pending)))
	return l.nextHbh, sent
}

// isClosed reports whether the connection is closed.
func (l *link) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// take removes and returns the request awaiting the answer hbh, or nil.
func (l *link) take(hbh uint32) *pending {
	l.mu.Lock()
	p := l.pending[hbh]
	if p != nil {
		delete(l.pending, hbh)
		l.count.Store(int32(len(l.pending)))
	}
	l.mu.Unlock()
	return p
}

// remove removes p from the table if it is there under hbh.
func (l *link) remove(hbh uint32, p *pending) {
	l.mu.Lock()
	if l.pending[hbh] == p {
		delete(l.pending, hbh)
		l.count.Store(int32(len(l.pending)))
	}
	l.mu.Unlock()
}

// drain returns what awaited an answer on l and empties the table; shut
// also closes it to new requests (the connection is gone).
func (l *link) drain(shut bool) []*pending {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = l.closed || shut
	out := make([]*pending, 0, len(l.pending))
	for _, p := range l.pending {
		out = append(out, p)
	}
	clear(l.pending)
	l.count.Store(0)
	return out
}

// hbh gives a Hop-by-Hop id for the agent's own requests (CER, DWR, DPR),
// which are not in the table.
func (l *link) hbh() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextHbh++
	return l.nextHbh
}
