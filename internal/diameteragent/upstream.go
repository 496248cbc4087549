package diameteragent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// State is an upstream connection's watchdog state (RFC 3539 §3.4).
type State int32

const (
	StateInitial State = iota // never connected yet
	StateOkay
	StateSuspect
	StateDown
	StateReopen
)

func (s State) String() string {
	return [...]string{"INITIAL", "OKAY", "SUSPECT", "DOWN", "REOPEN"}[s]
}

// upstream is a server in the peer table and the agent's connection to it.
//
// The watchdog follows RFC 3539's algorithm: one timer of Tw, set again
// whenever a message arrives (kept as the time of the last message, and
// the timer re-armed for the rest when it fires early); in OKAY a silent
// Tw sends a DWR and a second one makes the peer SUSPECT, which fails its
// pending requests over; a message in SUSPECT makes it OKAY again, a
// further silent Tw makes it DOWN and closes the connection. A connection
// opened after DOWN is in REOPEN until three DWRs in a row are answered.
// Only OKAY peers are routed to.
type upstream struct {
	a   *Agent
	cfg PeerConfig
	id  uint32

	state    atomic.Int32
	link     atomic.Pointer[link] // the open connection (after its CEA)
	lastRecv atomic.Int64         // unix ns of the last message received
	latency  atomic.Int64         // answer latency, ns (EWMA, 1/8)
	load     atomic.Int64         // RFC 8583 Load-Value + 1 (0: none reported)
	// watchdog exchanges: DWRs sent, DWAs received, the peer's DWRs
	dwrSent, dwaRecv, dwrRecv atomic.Int64

	mu         sync.Mutex
	conn       *link // the connection being opened or open
	capDone    bool  // conn's CEA came
	started    bool
	stopped    bool
	everUp     bool
	pendingDWR bool
	numDWA     int
	backoff    time.Duration
	timerGen   uint64 // a timer whose generation is not this one does nothing
	lastErr    string
}

func newUpstream(a *Agent, pc PeerConfig, id uint32) *upstream {
	return &upstream{a: a, cfg: pc, id: id}
}

// current returns the connection to route to: nil unless OKAY.
func (u *upstream) current() *link {
	if State(u.state.Load()) != StateOkay {
		return nil
	}
	return u.link.Load()
}

func (u *upstream) setState(s State) { u.state.Store(int32(s)) }

func (u *upstream) tw() time.Duration { return u.a.gen.Load().cfg.Watchdog }

// observe feeds an answer's latency to the average.
func (u *upstream) observe(d time.Duration) {
	old := u.latency.Load()
	if old == 0 {
		u.latency.Store(int64(d))
		return
	}
	u.latency.Store(old + (int64(d)-old)/8)
}

// start opens the connection the first time; later calls do nothing.
func (u *upstream) start() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.started || u.stopped {
		return
	}
	u.started = true
	go u.open()
}

// arm sets the watchdog timer for the current generation (u.mu held).
func (u *upstream) arm(d time.Duration) {
	gen := u.timerGen
	u.a.clock.AfterFunc(d, func() { u.tick(gen) })
}

// open dials, sends the CER and waits (on the timer) for the CEA.
func (u *upstream) open() {
	tw := u.tw()
	ctx, cancel := context.WithCancel(context.Background())
	t := u.a.clock.AfterFunc(tw, cancel)
	conn, err := u.a.dial(ctx, "tcp", u.cfg.Address)
	t.Stop()
	cancel()
	u.mu.Lock()
	if u.stopped {
		u.mu.Unlock()
		if err == nil {
			conn.Close()
		}
		return
	}
	if err != nil {
		u.retryLocked("dial: " + err.Error())
		u.mu.Unlock()
		return
	}
	l := newLink(conn)
	u.conn, u.capDone = l, false
	u.timerGen++
	u.arm(tw) // the CEA's deadline
	g := u.a.gen.Load()
	cer, err := buildCER(&g.cfg.Identity, g.cfg.advertised(u.cfg), l.hbh())
	u.mu.Unlock()
	if err == nil && l.send(cer) {
		go u.read(l)
		return
	}
	u.down(l, fmt.Sprintf("sending the CER: %v", err))
}

// retryLocked records why the peer is not connected and schedules the next
// attempt with exponential backoff (u.mu held, no connection open).
func (u *upstream) retryLocked(reason string) {
	cfg := u.a.gen.Load().cfg
	u.lastErr = reason
	if u.everUp {
		u.setState(StateDown)
	}
	u.backoff = min(max(2*u.backoff, cfg.ReconnectMin), cfg.ReconnectMax)
	u.timerGen++
	gen := u.timerGen
	u.a.clock.AfterFunc(u.backoff, func() {
		u.mu.Lock()
		ok := gen == u.timerGen && !u.stopped
		u.mu.Unlock()
		if ok {
			u.open()
		}
	})
	u.a.log.Info("Diameter peer down", "peer", u.cfg.Host, "reason", reason, "retry_in", u.backoff)
}

// down ends connection l: the peer goes DOWN, its pending requests fail
// over, and a reconnect is scheduled.
func (u *upstream) down(l *link, reason string) { u.downAfter(l, reason, false) }

// downAfter is down; with flush, the connection closes only once what is
// queued on it is written (a DPA).
func (u *upstream) downAfter(l *link, reason string, flush bool) {
	u.mu.Lock()
	if u.conn != l {
		u.mu.Unlock()
		l.close()
		return
	}
	u.conn, u.pendingDWR = nil, false
	u.link.Store(nil)
	if !u.stopped {
		u.retryLocked(reason)
	}
	u.mu.Unlock()
	if flush {
		l.closeAfterQueued(u.a.clock, u.tw())
	} else {
		l.close()
	}
	u.a.failover(u, l.drain(true))
}

// stop disconnects the peer for good (removed from the configuration, or
// the agent closing): DPR, then close once it is written. It returns the
// connection it ends, if there was one.
func (u *upstream) stop() *link {
	u.mu.Lock()
	u.stopped = true
	u.timerGen++
	l := u.conn
	u.conn, u.lastErr = nil, "disconnected by the agent"
	u.link.Store(nil)
	u.setState(StateDown)
	u.mu.Unlock()
	if l == nil {
		return nil
	}
	u.a.disconnect(l, u.tw())
	u.a.failover(u, l.drain(true))
	return l
}

// read handles the messages of connection l until it ends.
func (u *upstream) read(l *link) {
	g := u.a.gen.Load()
	fr := diameter.NewFramer(l.conn, 0, g.cfg.MaxLength)
	var in msgInfo
	for first := true; ; first = false {
		msg, err := fr.Next()
		if err == nil {
			in.wantApps = first // the CEA's applications are checked
			err = scan(msg, u.a.gen.Load().cfg.OriginHost, &in)
		}
		if err != nil {
			u.down(l, "connection: "+err.Error())
			return
		}
		u.lastRecv.Store(u.a.clock.Now().UnixNano())
		if !u.handle(l, msg, &in) {
			return
		}
	}
}

// handle acts on one message from the peer; false ends the connection.
func (u *upstream) handle(l *link, msg []byte, in *msgInfo) bool {
	u.mu.Lock()
	if u.conn != l {
		u.mu.Unlock()
		if l.dprSent.Load() { // the agent is leaving: read on until the DPA
			if isDPA(in) {
				l.close()
				return false
			}
			return true
		}
		return false
	}
	if !u.capDone {
		u.mu.Unlock()
		return u.capabilities(l, in)
	}
	isDWA := !in.request && in.base() && in.hdr.CommandCode == cmdDWR
	if isDWA {
		u.dwaRecv.Add(1)
		u.pendingDWR = false
		if State(u.state.Load()) == StateReopen {
			if u.numDWA++; u.numDWA >= 3 {
				u.setState(StateOkay)
			}
		}
	}
	if State(u.state.Load()) == StateSuspect { // any message: failback
		u.setState(StateOkay)
	}
	u.mu.Unlock()
	g := u.a.gen.Load()
	switch {
	case isDWA:
	case in.base() && in.request:
		switch in.hdr.CommandCode {
		case cmdDWR:
			u.dwrRecv.Add(1)
			u.a.answerSelf(l, in, ResultSuccess, "")
		case cmdDPR:
			u.a.answerSelf(l, in, ResultSuccess, "")
			u.downAfter(l, "the peer sent DPR", true)
			return false
		default: // a second CER
			u.a.answerSelf(l, in, ResultUnableToComply, "capabilities already exchanged")
		}
	case in.base(): // a DPA or a stray CEA
	case in.request:
		u.a.fromUpstream(u, l, msg, in, g)
	default:
		if g.cfg.DOIC != nil && in.hasOC {
			u.a.readReports(u, msg, in)
		}
		u.a.answered(l, msg, in)
	}
	return true
}

// capabilities checks the CEA, the first message of a connection.
func (u *upstream) capabilities(l *link, in *msgInfo) bool {
	switch {
	case in.request || in.hdr.CommandCode != cmdCER:
		u.down(l, fmt.Sprintf("first message is command %d, not a CEA", in.hdr.CommandCode))
		return false
	case in.resultCode != ResultSuccess:
		u.down(l, fmt.Sprintf("CEA Result-Code %d%s: %s", in.resultCode, resultName(in.resultCode), in.errorMessage))
		return false
	}
	if ours := u.a.gen.Load().cfg.advertised(u.cfg); !commonApplication(in.apps, ours) {
		// RFC 6733 §5.3: with no application in common the connection
		// is of no use; the CER's receiver should have answered 5010.
		u.down(l, fmt.Sprintf("CEA shares no application with the %d advertised (DIAMETER_NO_COMMON_APPLICATION): it lists %v", len(ours), in.apps))
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != l {
		return false
	}
	u.capDone, u.backoff, u.lastErr = true, 0, ""
	u.link.Store(l)
	u.timerGen++
	if u.everUp {
		u.setState(StateReopen)
		u.numDWA = 0
		u.sendDWRLocked(l)
	} else {
		u.everUp = true
		u.setState(StateOkay)
	}
	u.arm(u.tw())
	return true
}

func (u *upstream) sendDWRLocked(l *link) {
	g := u.a.gen.Load()
	if dwr, err := buildDWR(&g.cfg.Identity, l.hbh()); err == nil && l.send(dwr) {
		u.dwrSent.Add(1)
	}
	u.pendingDWR = true
}

// tick is the watchdog timer of generation gen firing.
func (u *upstream) tick(gen uint64) {
	u.mu.Lock()
	if gen != u.timerGen || u.stopped || u.conn == nil {
		u.mu.Unlock()
		return
	}
	l, tw := u.conn, u.tw()
	if !u.capDone {
		u.mu.Unlock()
		u.down(l, fmt.Sprintf("no CEA within %v", tw))
		return
	}
	state := State(u.state.Load())
	if since := time.Duration(u.a.clock.Now().UnixNano() - u.lastRecv.Load()); state != StateSuspect && since < tw {
		u.arm(tw - since) // a message came: the timer was set again then
		u.mu.Unlock()
		return
	}
	var failover, close bool
	switch state {
	case StateOkay:
		if !u.pendingDWR {
			u.sendDWRLocked(l)
		} else {
			u.setState(StateSuspect)
			u.lastErr = fmt.Sprintf("no answer to DWR within %v", tw)
			failover = true
		}
	case StateSuspect:
		close = true
	case StateReopen:
		if !u.pendingDWR {
			u.sendDWRLocked(l)
		} else if u.numDWA < 0 {
			close = true
		} else {
			u.numDWA = -1
		}
	}
	if !close {
		u.arm(tw)
	}
	u.mu.Unlock()
	switch {
	case close:
		u.down(l, fmt.Sprintf("watchdog: no answer within %v", 2*tw))
	case failover:
		u.a.log.Warn("Diameter peer SUSPECT: failing its pending requests over", "peer", u.cfg.Host)
		u.a.failover(u, l.drain(false))
	}
}

// lastError returns why the peer last went down.
func (u *upstream) lastError() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lastErr
}
