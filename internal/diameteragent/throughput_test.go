package diameteragent

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// echoServer answers each application request by echoing it with the R
// bit cleared, and CER and DWR properly; it writes all the answers to what
// one read brought in one write.
func echoServer(b *testing.B) string {
	id := Identity{OriginHost: "pcrf.example", OriginRealm: "pcrf.example"}
	return listen(b, func(c net.Conn) {
		defer c.Close()
		fr := diameter.NewFramer(c, 0, 1<<16)
		var in msgInfo
		out := make([]byte, 0, 64<<10)
		for {
			msg, err := fr.Next()
			if err != nil {
				return
			}
			if scan(msg, "", &in) == nil && in.base() && in.request {
				ans, _ := buildAnswer(&in, &id, []Application{{ID: diameter.AppGx}}, ResultSuccess, "")
				out = append(out, ans...)
			} else {
				n := len(out)
				out = append(out, msg...)
				out[n+4] &^= 0x80
			}
			if !fr.Ready() {
				if _, err := c.Write(out); err != nil {
					return
				}
				out = out[:0]
			}
		}
	})
}

// plainRelay is the anchor: a TCP proxy copying bytes both ways, as the
// plain caddy-l4 proxy does.
func plainRelay(b *testing.B, upstream string) string {
	return listen(b, func(c net.Conn) {
		u, err := net.Dial("tcp", upstream)
		if err != nil {
			c.Close()
			return
		}
		go func() { io.Copy(u, c); u.Close() }()
		io.Copy(c, u)
		c.Close()
	})
}

// drive sends n CCR-U over one connection to addr with window requests in
// flight, after a CER when cer is set, and returns the messages per second.
func drive(b *testing.B, addr string, n, window int, cer bool) float64 {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fr := diameter.NewFramer(c, 0, 1<<16)
	if cer {
		id := Identity{OriginHost: "pgw1.example", OriginRealm: "example.net"}
		m, _ := buildCER(&id, []Application{{ID: diameter.AppGx}}, 1)
		c.Write(m)
		if _, err := fr.Next(); err != nil {
			b.Fatal(err)
		}
	}
	msgs := make([][]byte, 64)
	for i := range msgs {
		msgs[i] = req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;" + string(rune('a'+i)), e2e: uint32(i + 1)}.bytes(b)
	}
	tokens := make(chan struct{}, window)
	for range window {
		tokens <- struct{}{}
	}
	start := time.Now()
	go func() {
		for i := range n {
			<-tokens
			if _, err := c.Write(msgs[i%len(msgs)]); err != nil {
				return
			}
		}
	}()
	for range n {
		if _, err := fr.Next(); err != nil {
			b.Fatal(err)
		}
		tokens <- struct{}{}
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkThroughputTCP: CCR-U per second over loopback TCP through the
// agent (two echo servers in its group), against a plain byte relay to one
// echo server in the same run (the plain caddy-l4 proxy's work). The
// issue's goal for the whole handler is ≥ 0.7× the plain proxy.
func BenchmarkThroughputTCP(b *testing.B) {
	const window = 64
	up1, up2 := echoServer(b), echoServer(b)
	cfg := baseConfig()
	cfg.Peers = []PeerConfig{{Host: "pcrf1.example", Realm: "pcrf.example", Address: up1}, {Host: "pcrf2.example", Realm: "pcrf.example", Address: up2}}
	cfg.Groups, cfg.Routes = cfg.Groups[:1], cfg.Routes[:1]
	a, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	a.Start()
	b.Cleanup(a.Close)
	for _, u := range a.gen.Load().peers {
		for State(u.state.Load()) != StateOkay {
			time.Sleep(time.Millisecond)
		}
	}
	agentAddr := listen(b, func(c net.Conn) { a.Serve(c) })
	relay := plainRelay(b, up1)
	n := max(b.N, 20_000)
	var agentRate, relayRate float64
	for range 3 { // interleaved, best of three each
		agentRate = max(agentRate, drive(b, agentAddr, n, window, true))
		relayRate = max(relayRate, drive(b, relay, n, window, false))
	}
	b.ReportMetric(agentRate, "agent-msg/s")
	b.ReportMetric(relayRate, "relay-msg/s")
	b.ReportMetric(agentRate/relayRate, "ratio")
}
