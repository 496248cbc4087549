package diameteragent

import (
	"sync"
	"time"
)

// pending is a request the agent forwarded and awaits the answer to. It
// sits in exactly one link's table at a time (owner, under the id hbh);
// whoever sets finished first — the answer, the timeout, a failed
// failover — answers the sender, and everything later is late.
//
// Lock order: pending.mu, then a link's mu. Nothing takes a pending's
// lock while holding a link's.
type pending struct {
	mu      sync.Mutex
	msg     []byte // as forwarded (Route-Record appended)
	from    *link  // where the answer goes
	origHbh uint32 // the sender's Hop-by-Hop id
	owner   *link
	hbh     uint32
	peer    *upstream // nil for a request to a downstream peer
	group   *group    // nil for a request to a downstream peer
	session uint64    // binding key (0: none)
	ends    bool      // the request ends its session
	// clientFeatures: the sender's OC-Feature-Vector (0: no DOIC)
	clientFeatures uint64
	timer          Timer
	sent           time.Time
	retried        bool
	finished       bool
}

// finish marks p answered, under p.mu; false if it already was.
func (p *pending) finishLocked() bool {
	if p.finished {
		return false
	}
	p.finished = true
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.group != nil {
		p.group.st.pending.Add(-1)
	}
	return true
}

// expire answers p with 3002 when its timeout passes unanswered.
func (a *Agent) expire(p *pending) {
	p.mu.Lock()
	if !p.finishLocked() {
		p.mu.Unlock()
		return
	}
	p.owner.remove(p.hbh, p) // not there if a failover holds it
	msg := p.msg
	p.mu.Unlock()
	a.counts.timedOut.Add(1)
	if p.group != nil {
		p.group.st.timedOut.Add(1)
	}
	a.refusePending(p, msg, ResultUnableToDeliver, "request timeout: no answer from the next hop")
}

// refusePending answers p's sender itself: msg is p's request as
// forwarded, whose header and Session-Id the answer takes, with the
// sender's own Hop-by-Hop id.
func (a *Agent) refusePending(p *pending, msg []byte, code uint32, text string) {
	var in msgInfo
	if scan(msg, "", &in) != nil {
		return // cannot be: the agent parsed it before forwarding it
	}
	in.hdr.HopByHopID = p.origHbh
	a.answerSelf(p.from, &in, code, text)
}

// answered passes an answer that came on l back to the sender of the
// request it answers; an answer to nothing pending is late, and dropped.
// in is the answer as scanned when it came from a server (nil from a
// client).
func (a *Agent) answered(l *link, msg []byte, in *msgInfo) {
	p := l.take(hopByHop(msg))
	if p == nil {
		a.counts.late.Add(1)
		return
	}
	p.mu.Lock()
	ok := p.finishLocked()
	p.mu.Unlock()
	if !ok {
		a.counts.late.Add(1)
		return
	}
	if p.peer != nil {
		p.peer.observe(a.clock.Now().Sub(p.sent))
	}
	if p.group == nil {
		in = nil
	}
	if !p.from.send(a.relayAnswer(p, msg, in)) {
		a.counts.undelivered.Add(1)
	}
}

// failover re-sends the requests that awaited answers from u on l, once
// each and with the T flag, to another server of their group, and moves
// their sessions' bindings along. A request that was re-sent already, or
// finds no other server, is answered 3002.
func (a *Agent) failover(u *upstream, ps []*pending) {
	for _, p := range ps {
		p.mu.Lock()
		if p.finished {
			p.mu.Unlock()
			continue
		}
		var to *upstream
		if !p.retried && p.group != nil {
			to, _ = p.group.pick(u)
		}
		added := false
		if to != nil {
			if l := to.current(); l != nil {
				if hbh, res := l.add(p, p.group.MaxPendingPerPeer); res == sent {
					msg := append([]byte(nil), p.msg...) // the old link's writer may still read p.msg
					setRetransmitted(msg)
					setHopByHop(msg, hbh)
					p.msg, p.owner, p.hbh, p.peer, p.retried = msg, l, hbh, to, true
					p.sent = a.clock.Now()
					if added = l.send(msg); !added {
						l.take(hbh)
					}
				}
			}
		}
		if !added {
			ok, msg := p.finishLocked(), p.msg
			p.mu.Unlock()
			if ok {
				a.refusePending(p, msg, ResultUnableToDeliver, "next hop failed and no other server could take the request")
			}
			continue
		}
		p.group.st.failedOver.Add(1)
		if p.session != 0 && !p.ends {
			a.rebind(p, to)
		}
		p.mu.Unlock()
	}
}
