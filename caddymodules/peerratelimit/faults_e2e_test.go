package peerratelimit_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// faultyUpstream is a Diameter peer that answers CER and then fails: if
// silent, it answers nothing more (it stops at a message boundary);
// otherwise it writes the first 30 bytes of each answer, sends them on
// half, and writes the rest only once release is closed (never, for an
// upstream that stalls inside a message). closed is closed when the proxy
// ends the upstream connection (the upstream reads EOF).
type faultyUpstream struct {
	addr    string
	half    chan []byte
	release chan struct{}
	closed  chan struct{}
}

func startFaultyUpstream(t *testing.T, silent bool) *faultyUpstream {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	u := &faultyUpstream{addr: l.Addr().String(), half: make(chan []byte, 16),
		release: make(chan struct{}), closed: make(chan struct{})}
	var once sync.Once
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go u.serve(conn, silent, &once)
		}
	}()
	return u
}

// serve answers one proxied connection (the harness's readiness probes
// open some that send nothing).
func (u *faultyUpstream) serve(conn net.Conn, silent bool, once *sync.Once) {
	defer conn.Close()
	msgs := make(chan *diam.Message, 1024)
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		defer close(msgs)
		for {
			m, err := diam.ReadMessage(conn, dict.Default)
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	requests := false
	defer func() {
		if requests {
			<-eof
			once.Do(func() { close(u.closed) })
		}
	}()
	for m := range msgs {
		a := m.Answer(diam.Success)
		a.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pcrf.example"))
		a.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
		b, _ := a.Serialize()
		if m.Header.CommandCode == diameter.CmdCapabilitiesExchange {
			conn.Write(b)
			continue
		}
		requests = true
		if silent {
			continue
		}
		conn.Write(b[:30])
		u.half <- b[:30]
		select {
		case <-u.release:
			conn.Write(b[30:])
		case <-eof:
			return
		}
	}
}

// waitHalf waits until the upstream has written part of its answer and the
// proxy has passed that part on to the client: from then on the proxy is
// inside a message of the upstream's stream.
func (c *diamClient) waitHalf(t *testing.T, u *faultyUpstream) []byte {
	t.Helper()
	var half []byte
	select {
	case half = <-u.half:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never got the request")
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c.mu.Lock()
		done := bytes.HasSuffix(c.raw, half)
		c.mu.Unlock()
		if done {
			return half
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream's partial answer never reached the client")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func metricOf(t *testing.T, c *e2e.Caddy, series string) float64 {
	t.Helper()
	v, _ := c.Metric(t, series)
	return v
}

// An upstream that stops answering, through bin/caddy:
//
//   - at a message boundary (silent): refusals still reach the client at
//     once, the connection stays open (the client's watchdog decides);
//   - inside a message (stalled): refusals wait for a boundary that never
//     comes; refusal_wait after the first of them, the proxy closes the
//     client connection, having written nothing into the partial message,
//     counts the waiting refusals as discarded (upstream_stalled) and
//     half-closes the upstream connection;
//   - slow inside a message: at most max_queued_refusals wait,
//     the rest are discarded and counted (queue_full); those that waited go
//     out whole at the boundary.
func TestDiameterUpstreamStopsAnswering(t *testing.T) {
	silent, stalled, slow := startFaultyUpstream(t, true), startFaultyUpstream(t, false), startFaultyUpstream(t, false)
	fSilent, fStalled, fSlow := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	server := func(front, name, extra, upstream string) string {
		return diameterLimit(front, name, extra, `profile pgw {
						message gx-ccr-i {
							rate 1 1
						}
					}`, upstream)
	}
	c := e2e.StartCaddy(t, "caddyfile", "{\n\tlayer4 {"+
		server(fSilent, "silent", "", silent.addr)+
		server(fStalled, "stalled", "refusal_wait 1s", stalled.addr)+
		server(fSlow, "slow", "max_queued_refusals 16\n\t\t\t\t\t\trefusal_wait 60s", slow.addr)+"\n\t}\n}\n")
	for _, f := range []string{fSilent, fStalled, fSlow} {
		c.WaitTCP(t, f)
	}
	ccr := func(typ, hbh uint32) []byte {
		return request(diameter.CmdCreditControl, diameter.AppGx, typ, hbh, fmt.Sprint("s;", hbh))
	}
	ccrIs := func(from, n uint32) []byte {
		var b []byte
		for h := from; h < from+n; h++ {
			b = append(b, ccr(1, h)...)
		}
		return b
	}
	decided := func(handler string) (rejected float64) {
		p := `caddy_edgesteer_peer_rate_limit_decisions_total{handler="` + handler + `",message_type="gx-ccr-i",profile="pgw",verdict=`
		return metricOf(t, c, p+`"rejected"}`)
	}
	discarded := func(handler, reason string) float64 {
		return metricOf(t, c, `caddy_edgesteer_peer_rate_limit_diameter_refusals_discarded_total{handler="`+handler+`",reason="`+reason+`"}`)
	}

	t.Run("silent at a boundary", func(t *testing.T) {
		pgw := dialDiameter(t, fSilent)
		// CCR-U 10 and CCR-I 11 are forwarded and never answered;
		// CCR-I 12-15 are refused, and the refusals come at once.
		pgw.send(t, append(ccr(2, 10), ccrIs(11, 5)...))
		for h := uint32(12); h <= 15; h++ {
			if a := pgw.waitFor(t, h, 10*time.Second); a.result != diameter.ResultUnableToDeliver || a.origin != "dra.example" {
				t.Errorf("refusal %d: %+v", h, a)
			}
		}
		select {
		case <-pgw.closed:
			t.Fatal("the proxy closed the connection of a silent upstream")
		default:
		}
	})

	t.Run("stalled inside a message", func(t *testing.T) {
		pgw := dialDiameter(t, fStalled)
		pgw.send(t, ccr(2, 20))
		half := pgw.waitHalf(t, stalled)
		pgw.send(t, ccrIs(21, 10))
		// The client connection is closed by the proxy, well before
		// the client would give up.
		select {
		case <-pgw.closed:
		case <-time.After(20 * time.Second):
			t.Fatal("the client connection was not closed while refusals waited for a stalled upstream")
		}
		pgw.mu.Lock()
		raw, answers := pgw.raw, len(pgw.answers)
		pgw.mu.Unlock()
		ceaLen := int(raw[1])<<16 | int(raw[2])<<8 | int(raw[3])
		if answers != 1 || !bytes.Equal(raw[ceaLen:], half) {
			t.Fatalf("the client got %d answers and %d bytes after the CEA, want the upstream's %d-byte partial answer and nothing else: %x",
				answers, len(raw)-ceaLen, len(half), raw[ceaLen:])
		}
		rejected := decided("stalled")
		if rejected < 8 || discarded("stalled", "upstream_stalled") != rejected {
			t.Errorf("%v refused, %v refusals discarded as upstream_stalled; want all of them", rejected, discarded("stalled", "upstream_stalled"))
		}
		// caddy-l4's proxy half-closes the upstream connection.
		select {
		case <-stalled.closed:
		case <-time.After(10 * time.Second):
			t.Error("the upstream connection was not closed")
		}
		c.WaitLog(t, "Diameter upstream stalled inside a message: closing the client connection", 5*time.Second)
	})

	t.Run("slow inside a message, bounded queue", func(t *testing.T) {
		pgw := dialDiameter(t, fSlow)
		pgw.send(t, ccr(2, 40))
		pgw.waitHalf(t, slow)
		// 200 CCR-I, all decided while the upstream is inside its
		// answer: one admitted, the rest refused; 16 refusals wait,
		// the others are discarded.
		const n = 200
		pgw.send(t, ccrIs(41, n))
		for deadline := time.Now().Add(20 * time.Second); ; {
			a := metricOf(t, c, `caddy_edgesteer_peer_rate_limit_decisions_total{handler="slow",message_type="gx-ccr-i",profile="pgw",verdict="admitted"}`)
			if a+decided("slow") == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v of %d CCR-I decided", a+decided("slow"), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		rejected := decided("slow")
		if full := discarded("slow", "queue_full"); full != rejected-16 {
			t.Fatalf("%v refused, %v discarded as queue_full; want all but the 16 that fit", rejected, full)
		}
		close(slow.release)
		// The admitted CCR-I's answer follows the queued refusals.
		pgw.waitFor(t, 40, 10*time.Second)
		pgw.waitFor(t, 41, 10*time.Second)
		pgw.mu.Lock()
		var refusals int
		for h, a := range pgw.answers {
			switch {
			case h == 1 || h == 40 || h == 41:
				if a.result != diam.Success {
					t.Errorf("answer %d: %+v", h, a)
				}
			case a.result == diameter.ResultUnableToDeliver && a.session == fmt.Sprint("s;", h):
				refusals++
			default:
				t.Errorf("answer %d: %+v", h, a)
			}
		}
		pgw.mu.Unlock()
		if refusals != 16 {
			t.Errorf("%d refusals written, want the 16 the queue holds", refusals)
		}
		if strings.Count(c.Logs(), "Diameter refusals discarded") != 1 {
			t.Errorf("want the overflow logged once per connection:\n%s", c.Logs())
		}
	})
}

// hangingMetrics serves the load like metricServer, but while hang is set
// it accepts the scrape and never answers (until the client gives up). It
// records how many scrapes were held at once at most.
type hangingMetrics struct {
	url      string
	mu       sync.Mutex
	load     int
	hang     bool
	held     int
	maxHeld  int
	finished int // hung scrapes the client gave up on
}

func startHangingMetrics(t *testing.T) *hangingMetrics {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &hangingMetrics{url: "http://" + l.Addr().String() + "/metrics"}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		if !m.hang {
			load := m.load
			m.mu.Unlock()
			fmt.Fprintf(w, "# TYPE db_cpu_percent gauge\ndb_cpu_percent{host=\"db1\"} %d\n", load)
			return
		}
		m.held++
		m.maxHeld = max(m.maxHeld, m.held)
		m.mu.Unlock()
		<-r.Context().Done() // the client closed the connection
		m.mu.Lock()
		m.held--
		m.finished++
		m.mu.Unlock()
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return m
}

func (m *hangingMetrics) set(load int, hang bool) {
	m.mu.Lock()
	m.load, m.hang = load, hang
	m.mu.Unlock()
}

func (m *hangingMetrics) stats() (maxHeld, finished int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxHeld, m.finished
}

// A load source that hangs (accepts the scrape, never answers), through
// bin/caddy: each read is given up after one interval, one at a time, so
// the sampler neither stalls nor piles up reads or goroutines; the throttle
// level stays where it was; requests are decided at the held level all the
// while; once the source answers again, the controller goes on from there.
func TestDynamicLoadSourceHangs(t *testing.T) {
	src := startHangingMetrics(t)
	src.set(67, false)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", exampleConfig(t, front, src.url))
	c.WaitTCP(t, front)
	level := func(want float64, what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; {
			v := adminView(t, c)
			if l := limitOf(v, "pgw2", "gx-ccr-i"); l.Effective == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: effective CCR-I limit %v, want %v (%+v)", what, limitOf(v, "pgw2", "gx-ccr-i").Effective, want, handlerView(v, "gx-ingress").Dynamic)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	level(100, "load 67 %") // 50 % throttled
	const errs = `caddy_edgesteer_peer_rate_limit_dynamic_load_source_errors_total{handler="gx-ingress"}`
	waitErrors := func(n float64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); metricOf(t, c, errs) < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%v failed reads of the hung source, want %v: the sampler stalled", metricOf(t, c, errs), n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	src.set(67, true)
	e0 := metricOf(t, c, errs)
	waitErrors(e0 + 3)
	g0 := metricOf(t, c, "go_goroutines")
	waitErrors(e0 + 13) // ten more hung reads, each given up after the 200 ms interval
	g1 := metricOf(t, c, "go_goroutines")
	maxHeld, finished := src.stats()
	if maxHeld > 2 || finished < 10 {
		t.Errorf("hung scrapes: %d held at once at most (want 1, 2 while one is torn down), %d given up", maxHeld, finished)
	}
	if g1-g0 > 5 {
		t.Errorf("goroutines grew from %v to %v over ten hung reads", g0, g1)
	}
	d := handlerView(adminView(t, c), "gx-ingress").Dynamic
	if d == nil || d.ThrottlePercent != 50 || !strings.Contains(d.LastError, "deadline exceeded") {
		t.Fatalf("while the source hangs: %+v; want the level held at 50 %% and the read's timeout shown", d)
	}
	c.WaitLog(t, "load source unreadable: keeping the last throttle level", 5*time.Second)

	// Requests are decided at the held level, none kept waiting (the
	// client gives up after 5 s: none may).
	o := burst(t, "http://"+front+"/gx/ccr-t", "pgw9", 2*time.Second)
	if got := o.ok.Load(); got > most(100, burstOf(100), o.elapsed) || got < 100 || o.rejected.Load() == 0 || o.other.Load() != 0 {
		t.Errorf("CCR-T while the source hangs: %d admitted in %v (at most %d), %d rejected, %d failed",
			got, o.elapsed, most(100, burstOf(100), o.elapsed), o.rejected.Load(), o.other.Load())
	}
	if d := handlerView(adminView(t, c), "gx-ingress").Dynamic; d == nil || d.ThrottlePercent != 50 {
		t.Fatalf("the level moved while the source hung: %+v", d)
	}

	// The source answers again, below the reversal threshold: the level
	// steps back from where it was held, one step per hold (2 s here).
	src.set(49, false)
	level(140, "one hold after the source answers again")
	if d := handlerView(adminView(t, c), "gx-ingress").Dynamic; d == nil || d.LastError != "" {
		t.Errorf("the error outlived the recovery: %+v", d)
	}
}
