package peerratelimit_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// diamServer is a go-diameter peer standing for a PCRF or an OCS: it
// answers CER, DWR and every request with DIAMETER_SUCCESS and counts the
// credit-control requests it receives by type.
func diamServer(t *testing.T) (string, *sync.Map) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var counts sync.Map
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				var mu sync.Mutex
				for {
					m, err := diam.ReadMessage(conn, dict.Default)
					if err != nil {
						return
					}
					b, _ := m.Serialize()
					h, _ := diameter.ParseHeader(b, 1<<20)
					in, _ := diameter.Classify(b, h)
					n, _ := counts.LoadOrStore(in.Type(), new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
					a := m.Answer(diam.Success)
					if in.SessionID != "" {
						a.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(in.SessionID))
					}
					a.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pcrf.example"))
					a.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
					mu.Lock()
					a.WriteTo(conn)
					mu.Unlock()
				}
			}()
		}
	}()
	return l.Addr().String(), &counts
}

func count(m *sync.Map, typ string) int64 {
	if v, ok := m.Load(typ); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// request builds a pGW's request; CC-Request-Type 0 leaves it out.
func request(cmd, app, reqType, hbh uint32, session string) []byte {
	b, _ := diameter.Request(cmd, app, reqType, hbh, hbh^0xabcdef, session, "pgw2.example", "example")
	return b
}

type answer struct {
	hbh, e2e, result uint32
	session, errMsg  string
	origin           string
}

// diamClient connects as a pGW, exchanges CER/CEA, and collects answers.
type diamClient struct {
	conn    net.Conn
	mu      sync.Mutex
	answers map[uint32]answer
	raw     []byte // every byte received, whole messages or not
	closed  chan struct{}
}

// rawTee records what the client reads.
type rawTee struct{ c *diamClient }

func (r rawTee) Read(p []byte) (int, error) {
	n, err := r.c.conn.Read(p)
	r.c.mu.Lock()
	r.c.raw = append(r.c.raw, p[:n]...)
	r.c.mu.Unlock()
	return n, err
}

func dialDiameter(t *testing.T, addr string) *diamClient {
	c := dialNoCER(t, addr)
	c.send(t, request(diameter.CmdCapabilitiesExchange, 0, 0, 1, ""))
	c.wait(t, 1, 5*time.Second)
	if a := c.get(1); a.result != diam.Success {
		t.Fatalf("CEA: %+v", a)
	}
	return c
}

// dialNoCER connects and collects answers, without a capabilities exchange.
func dialNoCER(t *testing.T, addr string) *diamClient {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &diamClient{conn: conn, answers: map[uint32]answer{}, closed: make(chan struct{})}
	go func() {
		defer close(c.closed)
		for {
			m, err := diam.ReadMessage(rawTee{c}, dict.Default)
			if err != nil {
				return
			}
			a := answer{hbh: m.Header.HopByHopID, e2e: m.Header.EndToEndID}
			if v, err := m.FindAVP(avp.ResultCode, 0); err == nil {
				a.result = uint32(v.Data.(datatype.Unsigned32))
			}
			if v, err := m.FindAVP(avp.SessionID, 0); err == nil {
				a.session = string(v.Data.(datatype.UTF8String))
			}
			if v, err := m.FindAVP(avp.ErrorMessage, 0); err == nil {
				a.errMsg = string(v.Data.(datatype.UTF8String))
			}
			if v, err := m.FindAVP(avp.OriginHost, 0); err == nil {
				a.origin = string(v.Data.(datatype.DiameterIdentity))
			}
			c.mu.Lock()
			c.answers[a.hbh] = a
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *diamClient) send(t *testing.T, b []byte) {
	if _, err := c.conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

func (c *diamClient) get(hbh uint32) answer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answers[hbh]
}

// waitFor waits for the answer to request hbh.
func (c *diamClient) waitFor(t *testing.T, hbh uint32, d time.Duration) answer {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		c.mu.Lock()
		a, ok := c.answers[hbh]
		c.mu.Unlock()
		if ok {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer to hop-by-hop %d in %v", hbh, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *diamClient) wait(t *testing.T, n int, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		c.mu.Lock()
		got := len(c.answers)
		c.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d answers, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// diameterLimit is a layer4 server at front that limits Diameter and
// proxies to upstream: a peer_rate_limit named name (unnamed when empty)
// answering as dra.example in realm example, with the lines of options
// added to its diameter block, and the block of profile.
func diameterLimit(front, name, options, profile, upstream string) string {
	if name != "" {
		name = "name " + name
	}
	return fmt.Sprintf(`
		%s {
			route {
				peer_rate_limit {
					%s
					diameter {
						origin_host dra.example
						origin_realm example
						%s
					}
					%s
				}
				proxy %s
			}
		}`, front, name, options, profile, upstream)
}

func draConfig(t *testing.T, front, pcrf, ocsFront, ocs string) string {
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "diameter-dra.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer("127.0.0.1:3868", front, "127.0.0.1:3869", pcrf,
		"127.0.0.1:3870", ocsFront, "127.0.0.1:3871", ocs).Replace(string(data))
}

// The DRA example through bin/caddy with go-diameter peers: bursts of
// CCR-I, CCR-U and CCR-T from a pGW; CCR-I and CCR-T are limited to their
// rates with 3002 answers matched to their requests, CCR-U passes
// untouched, and the PCRF sees exactly the admitted requests.
func TestDiameterPerMessageLimitsAndRefusals(t *testing.T) {
	pcrf, pcrfCounts := diamServer(t)
	ocs, _ := diamServer(t)
	front, ocsFront := e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", draConfig(t, front, pcrf, ocsFront, ocs))
	c.WaitTCP(t, front)

	pgw := dialDiameter(t, front)
	// 200 rounds 5 ms apart, each 4 CCR-I, 4 CCR-T and 1 CCR-U: CCR-I and
	// CCR-T arrive at up to 800/s (well past their 200/s), while what is
	// admitted stays under the overall 1000/s, so CCR-U is never refused.
	const rounds = 200
	start := time.Now()
	hbh := uint32(100)
	kinds := map[uint32]uint32{} // hop-by-hop → CC-Request-Type
	for range rounds {
		var batch []byte
		for _, rt := range []uint32{1, 1, 1, 1, 3, 3, 3, 3, 2, 12} { // 12: a Gy CCR-U
			hbh++
			kinds[hbh] = rt
			app := uint32(diameter.AppGx)
			if rt == 12 {
				app, rt = diameter.AppGy, 2
			}
			batch = append(batch, request(diameter.CmdCreditControl, app, rt, hbh, fmt.Sprintf("pgw2;%d;%d", rt, hbh))...)
		}
		pgw.send(t, batch)
		time.Sleep(5 * time.Millisecond)
	}
	pgw.wait(t, 1+len(kinds), 20*time.Second)
	elapsed := time.Since(start).Seconds()

	ok := map[uint32]int{}
	refused := map[uint32]int{}
	for h, rt := range kinds {
		a := pgw.get(h)
		if a.e2e != h^0xabcdef {
			t.Fatalf("answer to %d carries end-to-end %x", h, a.e2e)
		}
		switch a.result {
		case diam.Success:
			ok[rt]++
		case 3002:
			refused[rt]++
			if a.errMsg != "rate limit exceeded" || a.origin != "dra.example" || a.session != fmt.Sprintf("pgw2;%d;%d", rt, h) {
				t.Fatalf("refusal %+v", a)
			}
		default:
			t.Fatalf("answer %+v", a)
		}
	}
	max := int(200*elapsed) + burstOf(200) + 1 // rate × time + burst
	for _, rt := range []uint32{1, 3} {
		if ok[rt] > max || ok[rt] == 0 || refused[rt] == 0 {
			t.Errorf("CC-Request-Type %d: %d admitted (at most %d in %.2fs), %d refused", rt, ok[rt], max, elapsed, refused[rt])
		}
	}
	if ok[2] != rounds || refused[2] != 0 || ok[12] != rounds || refused[12] != 0 {
		t.Errorf("Gx CCR-U: %d admitted, %d refused; Gy CCR-U: %d admitted, %d refused; want all %d of each forwarded",
			ok[2], refused[2], ok[12], refused[12], rounds)
	}
	if got := count(pcrfCounts, "gx-ccr-i"); got != int64(ok[1]) {
		t.Errorf("the PCRF received %d CCR-I, %d were admitted", got, ok[1])
	}
	if got, gy := count(pcrfCounts, "gx-ccr-u"), count(pcrfCounts, "gy-ccr-u"); got != rounds || gy != rounds {
		t.Errorf("the PCRF received %d Gx and %d Gy CCR-U of %d each", got, gy, rounds)
	}
}

// Drop mode answers nothing for a refused request; a malformed message
// closes only its own connection.
func TestDiameterDropAndMalformed(t *testing.T) {
	pcrf, _ := diamServer(t)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", "{\n\tlayer4 {"+diameterLimit(front, "", "", `profile pgw {
						message gx-ccr-i {
							rate 1 1
						}
						action drop
					}`, pcrf)+"\n\t}\n}\n")
	c.WaitTCP(t, front)
	pgw := dialDiameter(t, front)
	other := dialDiameter(t, front)
	var batch []byte
	for i := range 20 {
		batch = append(batch, request(diameter.CmdCreditControl, diameter.AppGx, 1, uint32(1000+i), fmt.Sprint("s;", i))...)
	}
	// A DWR after the batch is a barrier: the PCRF answers in order, so
	// once its DWA is here every admitted CCR-I has been answered.
	batch = append(batch, request(diameter.CmdDeviceWatchdog, 0, 0, 99, "")...)
	pgw.send(t, batch)
	pgw.waitFor(t, 99, 10*time.Second)
	pgw.mu.Lock()
	answered := len(pgw.answers) - 2 // less the CEA and the DWA
	for _, a := range pgw.answers {
		if a.result != diam.Success {
			t.Errorf("drop mode answered %+v", a)
		}
	}
	pgw.mu.Unlock()
	if answered < 1 || answered > 2 {
		t.Fatalf("%d of 20 CCR-I answered; want the burst of 1 (plus at most one more), the rest dropped", answered)
	}

	// Garbage: version 7. Its connection closes, the other lives on.
	pgw.send(t, []byte{7, 0, 0, 20, 0x80, 0, 1, 16, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 2})
	select {
	case <-pgw.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("a malformed message did not close its connection")
	}
	other.send(t, request(diameter.CmdDeviceWatchdog, 0, 0, 77, ""))
	other.wait(t, 2, 5*time.Second)
	if a := other.get(77); a.result != diam.Success {
		t.Fatalf("the other connection's DWA: %+v", a)
	}
	c.WaitLog(t, "malformed Diameter message: closing this connection", 5*time.Second)
}

// Egress: the OCS group takes at most 100 requests/s across all the
// connections routed to it.
func TestDiameterEgressGroup(t *testing.T) {
	pcrf, _ := diamServer(t)
	ocs, ocsCounts := diamServer(t)
	front, ocsFront := e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", draConfig(t, front, pcrf, ocsFront, ocs))
	c.WaitTCP(t, ocsFront)
	a, b := dialDiameter(t, ocsFront), dialDiameter(t, ocsFront)
	start := time.Now()
	for i, cl := range []*diamClient{a, b} {
		var batch []byte
		for j := range 200 {
			batch = append(batch, request(diameter.CmdCreditControl, diameter.AppGy, 2, uint32(10_000*(i+1)+j), fmt.Sprint("gy;", i, ";", j))...)
		}
		cl.send(t, batch)
	}
	a.wait(t, 201, 20*time.Second)
	b.wait(t, 201, 20*time.Second)
	elapsed := time.Since(start).Seconds()
	admitted := 0
	for _, cl := range []*diamClient{a, b} {
		cl.mu.Lock()
		for h, ans := range cl.answers {
			if h != 1 && ans.result == diam.Success {
				admitted++
			}
		}
		cl.mu.Unlock()
	}
	if max := int(100*elapsed) + 5 + 1; admitted > max || admitted == 0 || admitted == 400 {
		t.Fatalf("OCS group admitted %d of 400 in %.2fs (at most %d)", admitted, elapsed, max)
	}
	if got := count(ocsCounts, "gy-ccr-u"); got != int64(admitted) {
		t.Fatalf("the OCS received %d, %d were admitted", got, admitted)
	}

	// CER, DWR and DPR pass even when the group's limit is used up: each
	// sits between CCRs that exhaust it, and the CCR right after it is
	// refused, so it was decided while the bucket was empty. The OCS
	// answers it (2001 from ocs's Origin-Host), the proxy does not.
	var batch []byte
	hbh := uint32(50_000)
	ccrs := func(n int) {
		for range n {
			hbh++
			batch = append(batch, request(diameter.CmdCreditControl, diameter.AppGy, 2, hbh, fmt.Sprint("gy;base;", hbh))...)
		}
	}
	base := map[uint32]string{}
	ccrs(50)
	for _, cmd := range []uint32{diameter.CmdCapabilitiesExchange, diameter.CmdDeviceWatchdog, diameter.CmdDisconnectPeer} {
		hbh++
		base[hbh] = fmt.Sprint(cmd)
		batch = append(batch, request(cmd, 0, 0, hbh, "")...)
		ccrs(5)
	}
	a.send(t, batch)
	for h, cmd := range base {
		if ans := a.waitFor(t, h, 10*time.Second); ans.result != diam.Success || ans.origin != "pcrf.example" {
			t.Errorf("command %s with the group's limit used up: answer %+v, want 2001 from the OCS", cmd, ans)
		}
		if after := a.waitFor(t, h+1, 10*time.Second); after.result != diameter.ResultUnableToDeliver {
			t.Errorf("the CCR after command %s: %+v, want it refused (the group exhausted)", cmd, after)
		}
	}
}

// The diameter matcher routes only pGWs (Origin-Host pgw*.example): a peer
// with another Origin-Host matches no route and is closed unanswered, and
// so is a client that does not speak Diameter.
func TestDiameterMatcherRoutesByOriginHost(t *testing.T) {
	pcrf, pcrfCounts := diamServer(t)
	ocs, _ := diamServer(t)
	front, ocsFront := e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", draConfig(t, front, pcrf, ocsFront, ocs))
	c.WaitTCP(t, front)
	for name, first := range map[string][]byte{
		"other origin host": func() []byte {
			m := diam.NewRequest(diameter.CmdCapabilitiesExchange, 0, dict.Default)
			m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("mme.example"))
			m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
			b, _ := m.Serialize()
			return b
		}(),
		"not diameter": []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
	} {
		conn, err := net.Dial("tcp", front)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(first)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		conn.Close()
		if n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
			t.Errorf("%s: read %d bytes, err %v; want the connection closed unanswered", name, n, err)
		}
	}
	if got := count(pcrfCounts, "cer"); got != 0 {
		t.Errorf("the PCRF saw %d CER from unmatched peers", got)
	}
}

// One connection rotating the Origin-Host of its requests gets no fresh
// bucket per request: requests are keyed by the identity its CER
// negotiated (or, before a CER, its remote address), each one whose
// Origin-Host differs is counted, and a profile that wants the per-request
// Origin-Host names it with {l4.peer_rate_limit.origin_host}.
func TestDiameterKeyIsTheCERIdentity(t *testing.T) {
	pcrf, _ := diamServer(t)
	byCER, byOrigin := e2e.Addr(t), e2e.Addr(t)
	server := func(front, name, peer string) string {
		return diameterLimit(front, name, "", fmt.Sprintf(`profile pgw {
						%s
						message gx-ccr-i {
							rate 200
						}
					}`, peer), pcrf)
	}
	c := e2e.StartCaddy(t, "caddyfile", "{\n\tlayer4 {"+server(byCER, "by-cer", "")+
		server(byOrigin, "by-origin", "peer {l4.peer_rate_limit.origin_host}")+"\n\t}\n}\n")
	c.WaitTCP(t, byCER)
	c.WaitTCP(t, byOrigin)

	// 320 CCR-I in one write: every 16th from pgw2.example (the CER's
	// identity), the others from 30 rotating Origin-Hosts.
	const n = 320
	rotating := func(cl *diamClient) (admitted int, elapsed time.Duration) {
		var batch []byte
		for i := range n {
			origin := fmt.Sprintf("pgw-%d.example", i%30)
			if i%16 == 0 {
				origin = "pgw2.example"
			}
			b, _ := diameter.Request(diameter.CmdCreditControl, diameter.AppGx, 1, uint32(100+i), uint32(100+i), fmt.Sprint("s;", i), origin, "example")
			batch = append(batch, b...)
		}
		start := time.Now()
		cl.send(t, batch)
		for i := range n {
			if cl.waitFor(t, uint32(100+i), 20*time.Second).result == diam.Success {
				admitted++
			}
		}
		return admitted, time.Since(start)
	}
	const mismatch = `caddy_edgesteer_peer_rate_limit_diameter_origin_host_mismatch_total{handler="by-cer"}`

	// After a CER: one bucket, the CER's peer's. A second CER, from
	// another Origin-Host, changes nothing.
	pgw := dialDiameter(t, byCER)
	again, _ := diameter.Request(diameter.CmdCapabilitiesExchange, 0, 0, 2, 2, "", "pgw-0.example", "example")
	pgw.send(t, again)
	pgw.waitFor(t, 2, 10*time.Second)
	got, took := rotating(pgw)
	if max := int(most(200, burstOf(200), took)); got > max || got == 0 {
		t.Errorf("after a CER, rotating Origin-Hosts: %d of %d admitted in %v, want at most one bucket's %d", got, n, took, max)
	}
	if v := metricOf(t, c, mismatch); v != n-n/16 {
		t.Errorf("%v requests counted with another Origin-Host than the CER's, want %d", v, n-n/16)
	}
	c.WaitLog(t, "Diameter request's Origin-Host differs from the connection's CER", 5*time.Second)

	// Before a CER: one bucket, the remote address's; nothing to compare.
	got, took = rotating(dialNoCER(t, byCER))
	if max := int(most(200, burstOf(200), took)); got > max || got == 0 {
		t.Errorf("without a CER, rotating Origin-Hosts: %d of %d admitted in %v, want at most one bucket's %d", got, n, took, max)
	}
	if v := metricOf(t, c, mismatch); v != n-n/16 {
		t.Errorf("mismatches counted without a CER: %v, want still %d", v, n-n/16)
	}

	// Keyed by the placeholder: a bucket per Origin-Host, so more than
	// one bucket could admit.
	got, took = rotating(dialDiameter(t, byOrigin))
	if one := int(most(200, burstOf(200), took)); got <= one {
		t.Errorf("keyed by {l4.peer_rate_limit.origin_host}: %d of %d admitted in %v, want more than one bucket's %d", got, n, took, one)
	}
}
