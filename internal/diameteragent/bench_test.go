package diameteragent

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"testing"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// discardConn is a connection whose writes vanish and whose reads block.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error) { return len(b), nil }
func (discardConn) Close() error                { return nil }

// benchAgent is an agent with its upstream peers OKAY on discarding
// connections, and a downstream peer, without goroutines reading.
func benchAgent(b *testing.B, cfg Config) (*Agent, *downstream) {
	a, err := New(cfg, Options{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, net.ErrClosed }})
	if err != nil {
		b.Fatal(err)
	}
	for _, u := range a.gen.Load().peers {
		u.link.Store(newLink(discardConn{}))
		u.setState(StateOkay)
	}
	b.Cleanup(a.Close)
	return a, &downstream{host: "pgw1.example", link: newLink(discardConn{})}
}

// BenchmarkRouteAndAnswer is the agent's per-message cost: scan a CCR-U,
// route it (realm table, Session-Id binding hit, pending bound), forward it
// (Route-Record, Hop-by-Hop id, timer), then take the answer back (pending
// lookup, Hop-by-Hop restored, queued downstream). sessions rotate over a
// bound table. BenchmarkRelayAnchor, in the same run, is the floor: the
// copies a relay without routing makes of a request and its answer.
func BenchmarkRouteAndAnswer(b *testing.B) {
	for _, sessions := range []int{1, 10_000} {
		b.Run("sessions="+strconv.Itoa(sessions), func(b *testing.B) {
			cfg := baseConfig()
			a, d := benchAgent(b, cfg)
			msgs := make([][]byte, sessions)
			for i := range msgs {
				msgs[i] = req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;" + strconv.Itoa(i), e2e: uint32(i)}.bytes(b)
			}
			answer := req{app: diameter.AppGx, ccType: 2, session: "x", e2e: 1}.bytes(b)
			answer[4] &^= 0x80 // an answer
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				routeAndAnswer(b, a, d, msgs[i%sessions], answer, nil)
			}
		})
	}
}

// routeAndAnswer scans and routes msg from d, then takes answer back from
// the server it went to; ans, if not nil, is where the answer is scanned
// as the upstream reader does (with DOIC's reading of it).
func routeAndAnswer(b *testing.B, a *Agent, d *downstream, msg, answer []byte, ans *msgInfo) {
	if err := scan(msg, "dra.example", &d.info); err != nil {
		b.Fatal(err)
	}
	a.route(d, msg, &d.info)
	var l *link
	var to *upstream
	for _, u := range a.gen.Load().groups["pcrf"].members {
		if c := u.link.Load(); c.count.Load() > 0 {
			l, to = c, u
		}
	}
	if l == nil {
		b.Fatal("not forwarded")
	}
	setHopByHop(answer, l.nextHbh)
	if ans != nil {
		if err := scan(answer, "dra.example", ans); err != nil {
			b.Fatal(err)
		}
		if a.gen.Load().cfg.DOIC != nil && ans.hasOC {
			a.readReports(to, answer, ans)
		}
	}
	a.answered(l, answer, ans)
	drainOut(l, d.link)
}

func drainOut(ls ...*link) {
	for _, l := range ls {
		for len(l.out) > 0 {
			select {
			case <-l.out:
			default:
			}
		}
	}
}

func BenchmarkRelayAnchor(b *testing.B) {
	up, down := newLink(discardConn{}), newLink(discardConn{})
	msg := req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;1", e2e: 1}.bytes(b)
	b.ReportAllocs()
	for range b.N {
		up.send(append([]byte(nil), msg...))
		down.send(answerCopy(msg, 7))
		drainOut(up, down)
	}
}

// BenchmarkBindingBytes reports the heap a Session-Id binding takes.
func BenchmarkBindingBytes(b *testing.B) {
	const n = 200_000
	for range b.N {
		cfg := baseConfig()
		cfg.MaxBindings = n
		a, _ := benchAgent(b, cfg)
		u := a.gen.Load().peers["pcrf1.example"]
		sids := make([][]byte, n)
		for i := range sids {
			sids[i] = []byte("pgw1.example;" + strconv.Itoa(i))
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, s := range sids {
			a.bind(a.sessionKey(s), u)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/binding")
		if a.bindings.Len() != n {
			b.Fatal(a.bindings.Len())
		}
		runtime.KeepAlive(sids)
	}
}
