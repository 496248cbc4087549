package diameter

import (
	"io"
	"sync"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
)

// BoundaryWriter writes the upstream's stream of messages to the client
// and slips the proxy's own messages (refusals) in only between whole
// messages of it. A message injected while the upstream is inside one
// waits in a bounded queue; one that does not fit is discarded (as if
// dropped), and when the oldest waiting message has waited too long the
// upstream is taken to have stalled and Stall is called (the caller closes
// the connection).
//
// Write passes the upstream's bytes through in the one write the caller
// gives (however many messages it holds) and only counts header and body
// bytes to know where the boundaries are: no copy and no allocation. The
// mutex is taken once per Write and per Inject — uncontended unless a
// refusal is injected at that moment (two goroutines: the upstream's copy
// loop writes, the client's reader injects).
type BoundaryWriter struct {
	// W is the client's side.
	W io.Writer
	// Stall closes the connection; it gets the number of messages
	// discarded with it and how long the oldest waited.
	Stall func(discarded int, waited time.Duration)
	// Overflow is called once, the first time a message is discarded for
	// a full queue.
	Overflow func()

	mu        sync.Mutex
	hdr       [diam.HeaderLength]byte
	hdrN      int  // header bytes seen of the current message
	remaining int  // body bytes left of the current message
	broken    bool // the upstream's stream did not parse: stop waiting for boundaries

	queue   [][]byte
	episode uint64      // counts the times the queue went from empty to waiting
	timer   *time.Timer // fires Stall for the current episode
	stalled bool        // stalled: discard from now on
	full    bool        // the queue overflowed once (reported once)
}

// Counter counts discarded messages (a prometheus.Counter is one).
type Counter interface{ Add(float64) }

// QueuePolicy is what applies to an injected message that has to wait:
// at most Max wait, for at most Wait; Full and Stalled count the messages
// discarded for a full queue and for a stalled upstream.
type QueuePolicy struct {
	Max           int
	Wait          time.Duration
	Full, Stalled Counter
}

// Write passes the upstream's bytes on and, at a boundary, the messages
// waiting for one (in one write with the upstream's bytes' tail when
// possible: they follow it at once).
func (b *BoundaryWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.W.Write(p)
	b.advance(p[:n])
	if err == nil && len(b.queue) > 0 && b.atBoundary() {
		_, err = b.W.Write(joined(b.queue))
		clear(b.queue)
		b.queue = nil
		b.timer.Stop()
	}
	return n, err
}

// joined is the messages as one slice (one write, so one syscall).
func joined(q [][]byte) []byte {
	if len(q) == 1 {
		return q[0]
	}
	n := 0
	for _, m := range q {
		n += len(m)
	}
	out := make([]byte, 0, n)
	for _, m := range q {
		out = append(out, m...)
	}
	return out
}

// Inject writes msg at once at a boundary, or queues it for the next one.
// It reports whether msg was discarded instead.
func (b *BoundaryWriter) Inject(msg []byte, q QueuePolicy) (discarded bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.stalled:
		q.Stalled.Add(1)
		return true, nil
	case b.atBoundary():
		_, err := b.W.Write(msg)
		return false, err
	case len(b.queue) >= q.Max:
		q.Full.Add(1)
		if !b.full && b.Overflow != nil {
			b.full = true
			b.Overflow()
		}
		return true, nil
	}
	if len(b.queue) == 0 {
		b.episode++
		ep, since := b.episode, time.Now()
		b.timer = time.AfterFunc(q.Wait, func() { b.expire(ep, since, q.Stalled) })
	}
	b.queue = append(b.queue, msg)
	return false, nil
}

// Queued returns how many injected messages wait for a boundary.
func (b *BoundaryWriter) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// expire ends the episode ep if its messages are still waiting: they are
// discarded and Stall is called.
func (b *BoundaryWriter) expire(ep uint64, since time.Time, counter Counter) {
	b.mu.Lock()
	if ep != b.episode || len(b.queue) == 0 || b.stalled {
		b.mu.Unlock()
		return
	}
	n := len(b.queue)
	b.queue, b.stalled = nil, true
	b.mu.Unlock()
	counter.Add(float64(n))
	if b.Stall != nil {
		b.Stall(n, time.Since(since))
	}
}

func (b *BoundaryWriter) atBoundary() bool { return b.broken || (b.remaining == 0 && b.hdrN == 0) }

// advance follows the upstream's stream over p: whole bodies are skipped
// by their length; only headers are looked at (in place when a header is
// whole in p, else gathered in hdr).
func (b *BoundaryWriter) advance(p []byte) {
	for len(p) > 0 && !b.broken {
		if b.remaining > 0 {
			k := min(b.remaining, len(p))
			b.remaining -= k
			p = p[k:]
			continue
		}
		var hdr []byte
		if b.hdrN == 0 && len(p) >= len(b.hdr) {
			hdr, p = p[:len(b.hdr)], p[len(b.hdr):]
		} else {
			k := copy(b.hdr[b.hdrN:], p)
			b.hdrN += k
			p = p[k:]
			if b.hdrN < len(b.hdr) {
				return
			}
			hdr, b.hdrN = b.hdr[:], 0
		}
		l, err := MessageLength(hdr, 1<<24)
		if err != nil {
			b.broken = true
			return
		}
		b.remaining = l - len(b.hdr)
	}
}
