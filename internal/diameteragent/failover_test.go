package diameteragent

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// A session's CCR-U go where its CCR-I went; CCR-T ends the binding.
func TestSessionBinding(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	first := map[string]string{}
	for i, s := range []string{"a", "b", "c", "d"} {
		first[s] = c.call(req{app: diameter.AppGx, ccType: 1, session: s, e2e: uint32(i + 1)}.bytes(t)).origin
	}
	for round := range 3 {
		for i, s := range []string{"a", "b", "c", "d"} {
			if got := c.call(req{app: diameter.AppGx, ccType: 2, session: s, e2e: uint32(100*round + i)}.bytes(t)).origin; got != first[s] {
				t.Fatalf("session %s CCR-U went to %s, its CCR-I to %s", s, got, first[s])
			}
		}
	}
	if n := h.agent.bindings.Len(); n != 4 {
		t.Fatalf("%d bindings, want 4", n)
	}
	for i, s := range []string{"a", "b", "c", "d"} {
		if got := c.call(req{app: diameter.AppGx, ccType: 3, session: s, e2e: uint32(900 + i)}.bytes(t)).origin; got != first[s] {
			t.Fatalf("session %s CCR-T went to %s", s, got)
		}
	}
	// The binding ends once the CCR-T is forwarded, which may be after
	// its answer came back (the answer is relayed by the server's reader).
	eventually(t, "every binding ended after the CCR-Ts", func() bool { return h.agent.bindings.Len() == 0 })
}

// Bindings are forgotten after the idle TTL.
func TestBindingIdleTTL(t *testing.T) {
	cfg := baseConfig()
	cfg.BindingTTL = time.Minute
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	c.call(req{app: diameter.AppGx, ccType: 1, session: "idle", e2e: 1}.bytes(t))
	if h.agent.bindings.Len() != 1 {
		t.Fatal("not bound")
	}
	h.clock.Advance(2 * time.Minute)
	if n := h.agent.bindings.Len(); n != 0 {
		t.Fatalf("%d bindings after twice the TTL idle", n)
	}
}

// When a server's connection fails, every request pending on it is re-sent
// once, with the T flag, to the other server of the group, which answers
// it; the sessions move with them.
func TestFailoverOnConnectionLoss(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	p1, p2 := h.srv["pcrf1.example"], h.srv["pcrf2.example"]
	p1.setHold(true)
	p2.setHold(true)
	const n = 10
	for i := range n {
		c.send(req{app: diameter.AppGx, ccType: 1, session: "s" + string(rune('a'+i)), e2e: uint32(i + 1)}.bytes(t))
	}
	eventually(t, "all held", func() bool { return len(p1.requests())+len(p2.requests()) == n })
	onP1 := map[string]bool{}
	for _, m := range p1.requests() {
		onP1[m.session] = true
	}
	p2.release()
	for range n - len(onP1) {
		c.next()
	}
	p1.conn.Close() // kill -9
	got := map[uint32]bool{}
	for range len(onP1) {
		a := c.next()
		if a.result != ResultSuccess || a.origin != "pcrf2.example" {
			t.Fatalf("after failover: %d from %s", a.result, a.origin)
		}
		got[a.e2e] = true
	}
	retried := 0
	for _, m := range p2.requests() {
		if m.flags&diam.RetransmittedFlag != 0 {
			retried++
			if !onP1[m.session] {
				t.Errorf("session %s re-sent but was not on pcrf1", m.session)
			}
		}
	}
	if retried != len(onP1) || len(got) != len(onP1) {
		t.Fatalf("%d re-sent with T, %d answered, %d were on pcrf1", retried, len(got), len(onP1))
	}
	if st := h.agent.gen.Load().groups["pcrf"].st; st.failedOver.Load() != int64(len(onP1)) || st.pending.Load() != 0 {
		t.Fatalf("failed over %d, pending %d", st.failedOver.Load(), st.pending.Load())
	}
	// The sessions moved: their CCR-U go to pcrf2 now, even with pcrf1 back.
	h.clock.Advance(time.Second) // reconnect
	h.waitState("pcrf1.example", StateReopen)
	h.reopen("pcrf1.example")
	for s := range onP1 {
		if a := c.call(req{app: diameter.AppGx, ccType: 2, session: s, e2e: 500}.bytes(t)); a.origin != "pcrf2.example" {
			t.Fatalf("session %s after failover answered by %s", s, a.origin)
		}
	}
}

// A request re-sent once is not re-sent again: when the second server
// fails too, it is answered 3002.
func TestFailoverOnlyOnce(t *testing.T) {
	cfg := baseConfig()
	cfg.Peers = append(cfg.Peers, PeerConfig{Host: "pcrf3.example", Realm: "pcrf.example", Address: "pcrf3:3868"})
	cfg.Groups[0].Peers = append(cfg.Groups[0].Peers, "pcrf3.example")
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	var all []*server
	for _, host := range cfg.Groups[0].Peers {
		h.srv[host].setHold(true)
		all = append(all, h.srv[host])
	}
	held := func() (n int, on *server) {
		for _, s := range all {
			if k := len(s.requests()); k > 0 {
				n, on = n+k, s
			}
		}
		return n, on
	}
	c.send(req{app: diameter.AppGx, e2e: 1}.bytes(t))
	eventually(t, "held", func() bool { n, _ := held(); return n == 1 })
	_, first := held()
	first.conn.Close()
	eventually(t, "re-sent", func() bool { n, _ := held(); return n == 2 })
	var second *server
	for _, s := range all {
		if s != first && len(s.requests()) == 1 {
			second = s
		}
	}
	second.conn.Close()
	if a := c.next(); a.result != ResultUnableToDeliver || a.origin != "dra.example" || a.flags&diam.ErrorFlag == 0 {
		t.Fatalf("after two failures: %d from %s", a.result, a.origin)
	}
	if n, _ := held(); n != 2 {
		t.Fatalf("the request was sent %d times, want twice", n)
	}
}

// An unanswered request gets 3002 at the group's request_timeout; the
// server's answer that comes later is discarded and counted.
func TestRequestTimeoutAndLateAnswer(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[1].RequestTimeout = 2 * time.Second
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	o1, o2 := h.srv["ocs1.example"], h.srv["ocs2.example"]
	o1.setHold(true)
	o2.setHold(true)
	c.send(req{app: diameter.AppGy, realm: "ocs.example", session: "g", e2e: 5}.bytes(t))
	eventually(t, "held", func() bool { return len(o1.requests())+len(o2.requests()) == 1 })
	h.clock.Advance(1999 * time.Millisecond)
	select {
	case a := <-c.answers:
		t.Fatalf("answered before the timeout: %d", a.result)
	case <-time.After(20 * time.Millisecond):
	}
	h.clock.Advance(time.Millisecond)
	if a := c.next(); a.result != ResultUnableToDeliver || a.e2e != 5 || !strings.Contains(a.errMsg, "timeout") {
		t.Fatalf("timeout answer %d %q", a.result, a.errMsg)
	}
	o1.release()
	o2.release()
	eventually(t, "late answer counted", func() bool { return h.agent.counts.late.Load() == 1 })
	select {
	case a := <-c.answers:
		t.Fatalf("late answer passed on: %d from %s", a.result, a.origin)
	case <-time.After(20 * time.Millisecond):
	}
}

// A group at its pending bound answers 3004 at once; the other group is
// not affected.
func TestFullGroupAnswersTooBusy(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[1].MaxPending = 3
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	h.srv["ocs1.example"].setHold(true)
	h.srv["ocs2.example"].setHold(true)
	for i := range 3 {
		c.send(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i + 1)}.bytes(t))
	}
	eventually(t, "held", func() bool {
		return len(h.srv["ocs1.example"].requests())+len(h.srv["ocs2.example"].requests()) == 3
	})
	if a := c.call(req{app: diameter.AppGy, realm: "ocs.example", e2e: 4}.bytes(t)); a.result != ResultTooBusy || a.e2e != 4 {
		t.Fatalf("fourth Gy: %d", a.result)
	}
	if a := c.call(req{app: diameter.AppGx, e2e: 5}.bytes(t)); a.result != ResultSuccess {
		t.Fatalf("Gx while the OCS group is full: %d", a.result)
	}
}

// reopen drives a peer in REOPEN to OKAY: three DWAs, one per Tw.
func (h *harness) reopen(host string) {
	h.t.Helper()
	u, s := h.peer(host), h.srv[host]
	base := s.count(cmdDWR, true)
	for i := 1; i <= 2; i++ {
		eventually(h.t, "DWA", func() bool { return s.count(cmdDWR, true) == base+i-1 })
		eventually(h.t, "DWA in", func() bool { u.mu.Lock(); defer u.mu.Unlock(); return !u.pendingDWR })
		if State(u.state.Load()) != StateReopen {
			h.t.Fatalf("%s is %v after %d DWAs", host, State(u.state.Load()), i)
		}
		h.clock.Advance(h.agent.gen.Load().cfg.Watchdog)
	}
	h.waitState(host, StateOkay)
}

// A session's binding is recorded before its first request leaves, so a
// request of the session sent once that answer is back finds it (the
// README: a Session-Id is bound to the server its first request went to).
// Each server notes the bindings at each request's receipt: the i-th new
// session's is already there, even when the agent pauses (20 ms) right
// after handing the request to the server's connection.
func TestBindingMadeBeforeTheRequestLeaves(t *testing.T) {
	pause := func() { time.Sleep(20 * time.Millisecond) }
	testHookSent.Store(&pause)
	t.Cleanup(func() { testHookSent.Store(nil) })
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	var mu sync.Mutex
	var atReceipt []int
	for _, host := range []string{"pcrf1.example", "pcrf2.example"} {
		s := h.srv[host]
		s.mu.Lock()
		s.reply = func(m message) []byte {
			mu.Lock()
			atReceipt = append(atReceipt, h.agent.bindings.Len())
			mu.Unlock()
			return answerTo(t, m, ResultSuccess, host)
		}
		s.mu.Unlock()
	}
	const n = 20
	for i := range n {
		c.call(req{app: diameter.AppGx, ccType: 1, session: fmt.Sprint("s", i), e2e: uint32(i + 1)}.bytes(t))
	}
	mu.Lock()
	defer mu.Unlock()
	for i, got := range atReceipt {
		if got != i+1 {
			t.Fatalf("request %d reached its server with %d bindings recorded, want %d (all: %v)", i, got, i+1, atReceipt)
		}
	}
	if len(atReceipt) != n {
		t.Fatalf("%d requests reached the servers, want %d", len(atReceipt), n)
	}
}
