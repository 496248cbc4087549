package diameteragent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// fakeClock runs timers when a test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the time on by d, running each timer due on the way at its
// time, in order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var due *fakeTimer
		for len(c.timers) > 0 && due == nil {
			t := c.timers[0]
			if t.at.After(end) {
				break
			}
			c.timers = c.timers[1:]
			if !t.stopped {
				due = t
			}
		}
		if due == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		if due.at.After(c.now) {
			c.now = due.at
		}
		due.stopped = true
		c.mu.Unlock()
		due.f()
	}
}

// message is what a test peer saw of a message.
type message struct {
	raw         []byte
	in          msgInfo
	cmd         uint32
	hbh, e2e    uint32
	flags       uint8
	session     string
	result      uint32
	origin      string
	errMsg      string
	routeRecord int
}

func readOne(t testing.TB, raw []byte) message {
	var in msgInfo
	in.wantApps = true
	if err := scan(raw, "", &in); err != nil {
		t.Errorf("peer got a malformed message: %v", err)
	}
	return message{raw: raw, in: in, cmd: in.hdr.CommandCode, hbh: in.hdr.HopByHopID, e2e: in.hdr.EndToEndID,
		flags: in.hdr.CommandFlags, session: string(in.sessionID), result: in.resultCode,
		origin: string(in.originHost), errMsg: string(in.errorMessage), routeRecord: in.routeRecords}
}

// server is a fake upstream Diameter server on one end of a pipe.
type server struct {
	t     testing.TB
	host  string
	cea   uint32   // Result-Code of its CEA (0: 2001)
	apps  []uint32 // applications its CEA lists (nil: those of the CER)
	mu    sync.Mutex
	conn  net.Conn
	got   []message
	hold  bool // keep requests unanswered
	held  []message
	mute  bool // answer nothing, not even DWR
	conns int
	reply func(m message) []byte // its answers to application requests (nil: answerTo's)
}

func (s *server) serve(conn net.Conn) {
	s.mu.Lock()
	s.conn = conn
	s.conns++
	s.mu.Unlock()
	fr := diameter.NewFramer(conn, 0, 1<<16)
	for {
		raw, err := fr.Next()
		if err != nil {
			return
		}
		m := readOne(s.t, append([]byte(nil), raw...))
		request := m.flags&diam.RequestFlag != 0
		s.mu.Lock()
		s.got = append(s.got, m)
		mute := s.mute
		// A held request joins held in the same step as got, so a
		// release that follows a request seen in got always answers it.
		hold := s.hold && !mute && request && m.cmd != cmdCER && m.cmd != cmdDWR && m.cmd != cmdDPR
		if hold {
			s.held = append(s.held, m)
		}
		s.mu.Unlock()
		if mute || !request || hold {
			continue
		}
		switch {
		case m.cmd == cmdCER:
			code := s.cea
			if code == 0 {
				code = ResultSuccess
			}
			s.write(ceaTo(s.t, m, code, s.host, s.apps))
		case m.cmd == cmdDWR || m.cmd == cmdDPR:
			s.write(answerTo(s.t, m, ResultSuccess, s.host))
		default:
			s.mu.Lock()
			reply := s.reply
			s.mu.Unlock()
			if reply != nil {
				s.write(reply(m))
			} else {
				s.write(answerTo(s.t, m, ResultSuccess, s.host))
			}
		}
	}
}

func (s *server) write(b []byte) {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	c.Write(b)
}

// release answers the held requests.
func (s *server) release() {
	s.mu.Lock()
	held := s.held
	s.held, s.hold = nil, false
	s.mu.Unlock()
	for _, m := range held {
		s.write(answerTo(s.t, m, ResultSuccess, s.host))
	}
}

// requests returns the application requests the server received.
func (s *server) requests() []message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []message
	for _, m := range s.got {
		if m.flags&diam.RequestFlag != 0 && !m.in.base() {
			out = append(out, m)
		}
	}
	return out
}

func (s *server) count(cmd uint32, request bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.got {
		if m.cmd == cmd && (m.flags&diam.RequestFlag != 0) == request {
			n++
		}
	}
	return n
}

func (s *server) setHold(h bool) { s.mu.Lock(); s.hold = h; s.mu.Unlock() }
func (s *server) setMute(m bool) { s.mu.Lock(); s.mute = m; s.mu.Unlock() }

// answerTo builds a server's answer to m (go-diameter's encoder through
// internal/diameter).
func answerTo(t testing.TB, m message, code uint32, host string) []byte {
	in := m.in
	b, err := diameter.Refusal(in.info(), code, host, "example.net", "")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ceaTo is a server's CEA listing apps (nil: those m, the CER, offers).
func ceaTo(t testing.TB, m message, code uint32, host string, apps []uint32) []byte {
	if apps == nil {
		apps = m.in.apps
	}
	var list []Application
	for _, id := range apps {
		list = append(list, Application{ID: id})
	}
	id := Identity{OriginHost: host, OriginRealm: "example.net", HostIPAddresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	b, err := buildAnswer(&m.in, &id, list, code, "")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// net is the pipes between the agent and its fake servers.
type testNet struct {
	mu      sync.Mutex
	servers map[string]*server // by address
}

func (n *testNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	s := n.servers[addr]
	n.mu.Unlock()
	if s == nil {
		return nil, errors.New("connection refused")
	}
	a, b := net.Pipe()
	go s.serve(b)
	return a, nil
}

// client is a fake downstream peer (a pGW).
type client struct {
	t       testing.TB
	host    string
	conn    net.Conn
	answers chan message
	reqs    chan message // server-initiated requests
	done    chan error
}

func (c *client) read() {
	fr := diameter.NewFramer(c.conn, 0, 1<<16)
	for {
		raw, err := fr.Next()
		if err != nil {
			close(c.answers)
			return
		}
		m := readOne(c.t, append([]byte(nil), raw...))
		if m.flags&diam.RequestFlag != 0 {
			c.reqs <- m
		} else {
			c.answers <- m
		}
	}
}

// next waits for the next answer.
func (c *client) next() message {
	c.t.Helper()
	select {
	case m, ok := <-c.answers:
		if !ok {
			c.t.Fatalf("%s: connection closed, no answer", c.host)
		}
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s: no answer", c.host)
	}
	return message{}
}

// send writes a request.
func (c *client) send(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("%s: write: %v", c.host, err)
	}
}

// call sends a request and waits for its answer.
func (c *client) call(b []byte) message {
	c.t.Helper()
	c.send(b)
	return c.next()
}

// req describes a request a client sends.
type req struct {
	cmd, app, ccType uint32
	session          string
	realm, destHost  string
	origin           string
	routeRecords     []string
	hbh, e2e         uint32
	noRealm          bool
}

func (r req) bytes(t testing.TB) []byte {
	if r.cmd == 0 {
		r.cmd = cmdCCR
	}
	if r.realm == "" && !r.noRealm {
		r.realm = "pcrf.example"
	}
	if r.origin == "" {
		r.origin = "pgw1.example"
	}
	if r.hbh == 0 {
		r.hbh = 0xAB00_0000 | r.e2e
	}
	m := diam.NewMessage(r.cmd, diam.RequestFlag|diam.ProxiableFlag, r.app, r.hbh, r.e2e, dict.Default)
	if r.session != "" {
		m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(r.session))
	}
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(r.origin))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example.net"))
	if r.realm != "" {
		m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity(r.realm))
	}
	if r.destHost != "" {
		m.NewAVP(avp.DestinationHost, avp.Mbit, 0, datatype.DiameterIdentity(r.destHost))
	}
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(r.app))
	if r.ccType != 0 {
		m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(r.ccType))
		m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
	}
	for _, rr := range r.routeRecords {
		m.NewAVP(avp.RouteRecord, avp.Mbit, 0, datatype.DiameterIdentity(rr))
	}
	b, err := m.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// harness is an agent, its fake servers and clock.
type harness struct {
	t     testing.TB
	clock *fakeClock
	net   *testNet
	agent *Agent
	srv   map[string]*server // by host
}

// baseConfig: Gx (16777238) to the PCRFs, Gy (4) to the OCSs, both for
// realm pcrf.example / ocs.example.
func baseConfig() Config {
	return Config{
		Identity: Identity{OriginHost: "dra.example", OriginRealm: "example.net",
			HostIPAddresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, ProductName: "edgesteer", VendorID: 10415},
		Applications: []Application{{ID: diameter.AppGx, VendorID: 10415}, {ID: diameter.AppGy}},
		Peers: []PeerConfig{
			{Host: "pcrf1.example", Realm: "pcrf.example", Address: "pcrf1:3868"},
			{Host: "pcrf2.example", Realm: "pcrf.example", Address: "pcrf2:3868"},
			{Host: "ocs1.example", Realm: "ocs.example", Address: "ocs1:3868"},
			{Host: "ocs2.example", Realm: "ocs.example", Address: "ocs2:3868"},
		},
		Groups: []GroupConfig{
			{Name: "pcrf", Peers: []string{"pcrf1.example", "pcrf2.example"}},
			{Name: "ocs", Peers: []string{"ocs1.example", "ocs2.example"}},
		},
		Routes: []Route{
			{Realm: "pcrf.example", Applications: []uint32{diameter.AppGx}, Group: "pcrf"},
			{Realm: "ocs.example", Applications: []uint32{diameter.AppGy}, Group: "ocs"},
		},
		Watchdog: 30 * time.Second,
	}
}

func newHarness(t testing.TB, cfg Config) *harness {
	h := &harness{t: t, clock: newFakeClock(), net: &testNet{servers: map[string]*server{}}, srv: map[string]*server{}}
	for _, p := range cfg.Peers {
		s := &server{t: t, host: p.Host}
		h.srv[p.Host] = s
		h.net.servers[p.Address] = s
	}
	a, err := New(cfg, Options{Clock: h.clock, Dial: h.net.dial})
	if err != nil {
		t.Fatal(err)
	}
	h.agent = a
	t.Cleanup(a.Close)
	return h
}

// start connects the agent and waits until every peer is OKAY.
func (h *harness) start() {
	h.agent.Start()
	for host := range h.srv {
		h.waitState(host, StateOkay)
	}
}

func (h *harness) peer(host string) *upstream {
	return h.agent.gen.Load().peers[host]
}

// eventually waits (in real time, for goroutines) until cond holds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) waitState(host string, s State) {
	h.t.Helper()
	eventually(h.t, fmt.Sprintf("%s %v", host, s), func() bool { return State(h.peer(host).state.Load()) == s })
}

// connect attaches a downstream client that has done its CER.
func (h *harness) connect(host string) *client {
	h.t.Helper()
	a, b := net.Pipe()
	c := &client{t: h.t, host: host, conn: a, answers: make(chan message, 1024), reqs: make(chan message, 64), done: make(chan error, 1)}
	go func() { c.done <- h.agent.Serve(b) }()
	go c.read()
	id := Identity{OriginHost: host, OriginRealm: "example.net"}
	cer, err := buildCER(&id, []Application{{ID: diameter.AppGx, VendorID: 10415}, {ID: diameter.AppGy}}, 1)
	if err != nil {
		h.t.Fatal(err)
	}
	if cea := c.call(cer); cea.result != ResultSuccess || cea.cmd != cmdCER {
		h.t.Fatalf("CEA %+v", cea)
	}
	h.t.Cleanup(func() { a.Close() })
	return c
}

// listen listens on loopback for the test's time and serves each
// connection it accepts in a goroutine of its own.
func listen(tb testing.TB, serve func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	acceptAll(ln, serve)
	return ln.Addr().String()
}

// acceptAll serves each connection ln accepts, until it is closed.
func acceptAll(ln net.Listener, serve func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
}
