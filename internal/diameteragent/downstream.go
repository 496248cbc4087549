package diameteragent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// downstream is a client peer connected to the agent (a pGW).
type downstream struct {
	host  string // the CER's Origin-Host, lowercased
	realm string
	link  *link
	info  msgInfo // the message in hand (one reader goroutine)
}

// ErrCapabilities is what Serve returns when the peer's first message is
// not an acceptable CER.
var ErrCapabilities = errors.New("capabilities exchange failed")

// Serve runs a downstream connection until it ends: the capabilities
// exchange (the first message must be a CER; the agent answers it with its
// own identity and applications, 5010 and the end when none is shared),
// then DWR/DWA, DPR/DPA and the routing of every request. A second CER is
// answered 5012 DIAMETER_UNABLE_TO_COMPLY and changes nothing. It closes
// conn before returning.
func (a *Agent) Serve(conn net.Conn) error {
	a.mu.Lock()
	closedAgent := a.closed
	a.mu.Unlock()
	if closedAgent {
		conn.Close()
		return errors.New("the Diameter agent is closed")
	}
	g := a.gen.Load()
	l := newLink(conn)
	defer l.close()
	fr := diameter.NewFramer(conn, 0, g.cfg.MaxLength)
	d := &downstream{link: l}
	d.info.wantApps = true
	msg, err := fr.Next()
	if err == nil {
		err = scan(msg, g.cfg.OriginHost, &d.info)
	}
	if err != nil {
		return err
	}
	if err := a.accept(d); err != nil {
		l.closeAfterQueued(a.clock, g.cfg.Watchdog)
		<-l.done
		return err
	}
	defer a.leave(d)
	d.info.wantApps = false
	for {
		msg, err := fr.Next()
		if err == nil {
			err = scan(msg, a.gen.Load().cfg.OriginHost, &d.info)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		in := &d.info
		switch {
		case in.base() && in.request:
			switch in.hdr.CommandCode {
			case cmdDWR:
				a.counts.downstreamDWR.Add(1)
				a.answerSelf(l, in, ResultSuccess, "")
			case cmdDPR:
				a.counts.downstreamDPR.Add(1)
				a.answerSelf(l, in, ResultSuccess, "")
				l.closeAfterQueued(a.clock, g.cfg.Watchdog)
				<-l.done
				return nil
			default:
				a.answerSelf(l, in, ResultUnableToComply, "capabilities already exchanged")
			}
		case isDPA(in) && l.dprSent.Load(): // the answer to the agent's DPR
			return nil
		case in.base(): // DWA, DPA
		case in.request:
			a.route(d, msg, in)
		default:
			a.answered(l, msg, nil)
		}
	}
}

// accept answers the CER in d.info and registers d by its Origin-Host (a
// newer connection of the same host takes the name over: server-initiated
// requests go to it).
func (a *Agent) accept(d *downstream) error {
	g := a.gen.Load()
	in := &d.info
	switch {
	case !in.request || !in.base() || in.hdr.CommandCode != cmdCER:
		return fmt.Errorf("%w: first message is command %d, not a CER", ErrCapabilities, in.hdr.CommandCode)
	case len(in.originHost) == 0 || len(in.originRealm) == 0:
		a.answerSelf(d.link, in, ResultMissingAVP, "CER without Origin-Host or Origin-Realm")
		return fmt.Errorf("%w: CER without Origin-Host or Origin-Realm", ErrCapabilities)
	case !commonApplication(in.apps, g.cfg.Applications):
		a.answerSelf(d.link, in, ResultNoCommonApplication, "no application in common with the agent")
		return fmt.Errorf("%w: %s: no common application in %v", ErrCapabilities, in.originHost, in.apps)
	}
	d.host, d.realm = strings.ToLower(string(in.originHost)), string(in.originRealm)
	a.mu.Lock()
	a.downs[d.host] = d
	a.mu.Unlock()
	a.answerSelf(d.link, in, ResultSuccess, "")
	return nil
}

// leave unregisters d, and answers 3002 to the requests servers sent it
// that it will not answer now.
func (a *Agent) leave(d *downstream) {
	a.mu.Lock()
	if a.downs[d.host] == d {
		delete(a.downs, d.host)
	}
	a.mu.Unlock()
	for _, p := range d.link.drain(true) {
		p.mu.Lock()
		ok, msg := p.finishLocked(), p.msg
		p.mu.Unlock()
		if ok {
			a.refusePending(p, msg, ResultUnableToDeliver, "the destination peer disconnected")
		}
	}
}

// commonApplication reports whether the peer's applications share one
// with the agent's, the Relay application on either side matching all.
func commonApplication(theirs []uint32, ours []Application) bool {
	if slices.Contains(theirs, relayApp) {
		return true
	}
	for _, o := range ours {
		if o.ID == relayApp || slices.Contains(theirs, o.ID) {
			return true
		}
	}
	return false
}

// fromUpstream routes a request a server sent (RAR, ASR) to the
// downstream peer its Destination-Host names.
func (a *Agent) fromUpstream(u *upstream, l *link, msg []byte, in *msgInfo, g *generation) {
	if in.loop {
		a.answerSelf(l, in, ResultLoopDetected, "the agent's identity is in the Route-Record")
		return
	}
	a.mu.Lock()
	d, _ := lookupLower(a.downs, in.destHost)
	a.mu.Unlock()
	if d == nil {
		a.answerSelf(l, in, ResultUnableToDeliver, "Destination-Host is not a connected peer of the agent")
		return
	}
	p := &pending{from: l, origHbh: in.hdr.HopByHopID, msg: forwarded(msg, u.cfg.Host, nil), sent: a.clock.Now()}
	switch a.forward(p, d.link, DefaultMaxPending, g.cfg.ServerRequestTimeout) {
	case full:
		a.answerSelf(l, in, ResultTooBusy, "the destination peer has too many requests pending")
	case closed:
		a.answerSelf(l, in, ResultUnableToDeliver, "the destination peer disconnected")
	}
}

// forward sends p's request on to under a fresh Hop-by-Hop id, with its
// timeout. It fails when to has limit requests pending or its queue is
// full (full), or its connection is gone (closed).
func (a *Agent) forward(p *pending, to *link, limit int, timeout time.Duration) forwardResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	hbh, res := to.add(p, limit)
	if res != sent {
		return res
	}
	setHopByHop(p.msg, hbh)
	p.owner, p.hbh = to, hbh
	if !to.send(p.msg) {
		to.take(hbh)
		if to.isClosed() {
			return closed
		}
		return full
	}
	// Set after the send, under p.mu: an answer coming first waits for it.
	p.timer = a.clock.AfterFunc(timeout, func() { a.expire(p) })
	return sent
}
