package peerratelimit

import (
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// boundaryWriter writes the upstream's answers to the client and slips the
// proxy's own answers (refusals) in only between whole messages. A refusal
// that arrives while the upstream is inside a message waits in a bounded
// queue; one that does not fit is discarded (as if dropped), and when the
// oldest waiting refusal has waited too long the upstream is taken to have
// stalled and the client connection is closed (stall).
type boundaryWriter struct {
	mu        sync.Mutex
	w         io.Writer
	hdr       [20]byte
	hdrN      int  // header bytes seen of the current message
	remaining int  // body bytes left of the current message
	broken    bool // the upstream's stream did not parse: stop waiting for boundaries

	queue   [][]byte
	episode uint64      // counts the times the queue went from empty to waiting
	timer   *time.Timer // fires stall for the current episode
	stalled bool        // closed for a stalled upstream: discard from now on
	full    bool        // the queue overflowed once (logged once)

	// stall closes the connection; it gets the number of refusals
	// discarded with it and how long the oldest waited.
	stall func(discarded int, waited time.Duration)
	// overflow is called once, the first time a refusal is discarded.
	overflow func()
}

// queuePolicy is the Diameter settings in force for queued refusals (a
// reload's new settings apply from the next refusal) and their counters.
type queuePolicy struct {
	max  int
	wait time.Duration
	// counters of discarded refusals: the queue was full; the upstream
	// stalled inside a message.
	full, stalled prometheus.Counter
}

func (b *boundaryWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.w.Write(p)
	b.advance(p[:n])
	if err == nil && len(b.queue) > 0 && b.atBoundary() {
		for len(b.queue) > 0 && err == nil {
			_, err = b.w.Write(b.queue[0])
			b.queue[0] = nil
			b.queue = b.queue[1:]
		}
		if len(b.queue) == 0 {
			b.queue = nil
			b.timer.Stop()
		}
	}
	return n, err
}

// inject writes msg at once at a boundary, or queues it for the next one.
// It reports whether msg was discarded instead.
func (b *boundaryWriter) inject(msg []byte, q queuePolicy) (discarded bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.stalled:
		q.stalled.Inc()
		return true, nil
	case b.atBoundary():
		_, err := b.w.Write(msg)
		return false, err
	case len(b.queue) >= q.max:
		q.full.Inc()
		if !b.full && b.overflow != nil {
			b.full = true
			b.overflow()
		}
		return true, nil
	}
	if len(b.queue) == 0 {
		b.episode++
		ep, since := b.episode, time.Now()
		b.timer = time.AfterFunc(q.wait, func() { b.expire(ep, since, q.stalled) })
	}
	b.queue = append(b.queue, msg)
	return false, nil
}

// expire ends the episode ep if its refusals are still waiting: they are
// discarded and the connection closed.
func (b *boundaryWriter) expire(ep uint64, since time.Time, counter prometheus.Counter) {
	b.mu.Lock()
	if ep != b.episode || len(b.queue) == 0 || b.stalled {
		b.mu.Unlock()
		return
	}
	n := len(b.queue)
	b.queue, b.stalled = nil, true
	b.mu.Unlock()
	counter.Add(float64(n))
	if b.stall != nil {
		b.stall(n, time.Since(since))
	}
}

func (b *boundaryWriter) atBoundary() bool { return b.broken || (b.remaining == 0 && b.hdrN == 0) }

func (b *boundaryWriter) advance(p []byte) {
	for len(p) > 0 && !b.broken {
		if b.remaining > 0 {
			k := min(b.remaining, len(p))
			b.remaining -= k
			p = p[k:]
			continue
		}
		k := copy(b.hdr[b.hdrN:], p)
		b.hdrN += k
		p = p[k:]
		if b.hdrN == len(b.hdr) {
			h, err := diameter.ParseHeader(b.hdr[:], 1<<24)
			if err != nil {
				b.broken = true
				return
			}
			b.remaining, b.hdrN = int(h.MessageLength)-len(b.hdr), 0
		}
	}
}
