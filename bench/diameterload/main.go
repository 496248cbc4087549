// Command diameterload measures Diameter messages per second through a
// proxy or agent, with go-diameter encoding on both ends.
//
//	diameterload -serve 127.0.0.1:3869            # answer every request with 2001
//	diameterload -target 127.0.0.1:3868 -d 5s     # CER, then pipelined CCR-U; prints msgs/s
//
// Only answers with Result-Code 2001 (DIAMETER_SUCCESS) count; any other
// answer, or one without a Result-Code, makes the run fail unless
// -allow-refusals is given (a benchmark that means to measure refusals).
//
// For a routing agent or relay (bench/diameter_agent.sh): -realm adds a
// Destination-Realm and the P bit to each request, -sessions rotates the
// requests over that many Session-Ids, -latency prints the answer latency
// (p50, p99, max) after the rate; -serve with -host and -realm answers as
// that identity, a full CEA (Gx and Gy) included, and with -fast answers
// from the raw bytes (the project's Framer, one write per read) instead of
// go-diameter's dictionary parse, so the peer costs less than the front.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

func main() {
	serve := flag.String("serve", "", "serve as the upstream peer on this address")
	host := flag.String("host", "peer.example", "the server's Origin-Host (with -serve)")
	target := flag.String("target", "", "proxy to load")
	dur := flag.Duration("d", 5*time.Second, "load duration")
	window := flag.Int("window", 64, "requests in flight")
	realm := flag.String("realm", "", "Destination-Realm of each request (and the P bit); with -serve, the server's Origin-Realm")
	sessions := flag.Int("sessions", 1, "Session-Ids the requests rotate over")
	origin := flag.String("origin", "pgw1.example", "the client's Origin-Host (a relay may hold on to a closed peer's name for a while)")
	latency := flag.Bool("latency", false, "also print the answer latency: p50, p99 and max in ms")
	fast := flag.Bool("fast", false, "with -serve: answer from the raw bytes, one write per read")
	allowRefusals := flag.Bool("allow-refusals", false, "count answers other than 2001 instead of failing")
	rate := flag.Int("rate", 0, "requests per second at most (0: as many as the window lets through)")
	flag.Parse()
	switch {
	case *serve != "":
		r := *realm
		if r == "" {
			r = "example"
		}
		log.Fatal(runServer(*serve, *host, r, *fast))
	case *target != "":
		res, err := runClient(*target, *origin, *dur, *window, *realm, max(*sessions, 1), *rate)
		if err != nil {
			log.Fatal(err)
		}
		if res.other > 0 && !*allowRefusals {
			log.Fatalf("%d answers were not DIAMETER_SUCCESS (2001) beside %d that were", res.other, res.success)
		}
		if *latency {
			fmt.Printf("%.0f %.3f %.3f %.3f\n", float64(res.success)/dur.Seconds(), ms(res.lat, 0.50), ms(res.lat, 0.99), ms(res.lat, 1))
		} else {
			fmt.Printf("%.0f\n", float64(res.success)/dur.Seconds())
		}
	default:
		flag.Usage()
	}
}

// ms is the q-quantile of sorted latencies, in milliseconds.
func ms(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i]) / 1e6
}

func runServer(addr, host, realm string, fast bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		if fast {
			go serveFast(conn, host, realm)
		} else {
			go serveDict(conn, host, realm)
		}
	}
}

// serveDict answers each message after go-diameter's dictionary parse.
func serveDict(conn net.Conn, host, realm string) {
	defer conn.Close()
	for {
		m, err := diam.ReadMessage(conn, dict.Default)
		if err != nil {
			return
		}
		var b []byte
		if m.Header.CommandCode == diameter.CmdCapabilitiesExchange {
			b = cea(m.Header, host, realm)
		} else {
			a := m.Answer(diam.Success)
			a.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(host))
			a.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity(realm))
			if b, err = a.Serialize(); err != nil {
				log.Fatal(err)
			}
		}
		if _, err := conn.Write(b); err != nil {
			return
		}
	}
}

// serveFast answers from the raw bytes: the request's identifiers and
// Session-Id, 2001, the server's identity; all the answers to what one
// read brought go out in one write.
func serveFast(conn net.Conn, host, realm string) {
	defer conn.Close()
	fr := diameter.NewFramer(conn, 0, 1<<16)
	var in diameter.Info
	out := make([]byte, 0, 64<<10)
	for {
		msg, err := fr.Next()
		if err != nil {
			return
		}
		if err := in.Parse(msg); err != nil {
			log.Printf("malformed message: %v", err)
			return
		}
		if !in.Request {
			continue
		}
		var b []byte
		if in.Header.CommandCode == diameter.CmdCapabilitiesExchange {
			b = cea(in.Header, host, realm)
		} else if b, err = diameter.Refusal(in, diam.Success, host, realm, ""); err != nil {
			log.Fatal(err)
		}
		out = append(out, b...)
		if !fr.Ready() {
			if _, err := conn.Write(out); err != nil {
				return
			}
			out = out[:0]
		}
	}
}

// cea is the server's answer to a CER: 2001, its identity and Gx and Gy.
func cea(h *diam.Header, host, realm string) []byte {
	m := diam.NewMessage(h.CommandCode, 0, 0, h.HopByHopID, h.EndToEndID, dict.Default)
	m.Header.HopByHopID, m.Header.EndToEndID = h.HopByHopID, h.EndToEndID
	m.NewAVP(avp.ResultCode, avp.Mbit, 0, datatype.Unsigned32(diam.Success))
	diameter.AddCapabilities(m, host, realm, "diameterload")
	b, err := m.Serialize()
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// ccrU is a Gx CCR-U of session; with realm, a Destination-Realm and the
// P bit, as a relay or agent needs.
func ccrU(origin, session, realm string) []byte {
	flags := uint8(diam.RequestFlag)
	if realm != "" {
		flags |= diam.ProxiableFlag
	}
	m := diam.NewMessage(diameter.CmdCreditControl, flags, diameter.AppGx, 0, 0, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(session))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(origin))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
	if realm != "" {
		m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity(realm))
	}
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGx))
	m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(2))
	m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
	b, err := m.Serialize()
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// result is a client run's count of answers and, sorted, their latencies
// (those received after the warm-up).
type result struct {
	success, other int64
	lat            []time.Duration
}

// ring is the number of send times kept, by Hop-by-Hop id; window ≪ ring.
const ring = 1 << 16

// runClient keeps window CCR-U requests in flight for d (after a 1 s
// warm-up), each with its own Hop-by-Hop id, and counts the answers with
// Result-Code 2001 and those with any other. It ends with a DPR (and waits
// up to 2 s for the DPA), as a peer leaving does; a connection that ends
// before is an error.
func runClient(addr, origin string, d time.Duration, window int, realm string, sessions, rate int) (result, error) {
	if window >= ring {
		return result{}, fmt.Errorf("window %d: at most %d", window, ring-1)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	if err := exchangeCapabilities(conn, origin); err != nil {
		return result{}, err
	}
	msgs := make([][]byte, sessions)
	for i := range msgs {
		msgs[i] = ccrU(origin, fmt.Sprintf("%s;load;%d", origin, i), realm)
	}
	a := &answers{start: time.Now(), slots: make(chan struct{}, window), done: make(chan struct{}), dpa: make(chan struct{})}
	go a.read(conn)
	end := time.Now().Add(d + time.Second)
	go func() { time.Sleep(time.Second); a.counting.Store(true) }() // 1 s warm-up
	buf := make([]byte, 0, 4096)
	begin := time.Now()
	for i := uint32(1); time.Now().Before(end); i++ {
		if rate > 0 { // paced: request i goes out at i/rate seconds
			time.Sleep(time.Until(begin.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		}
		select {
		case a.slots <- struct{}{}:
		case <-a.done:
			return result{}, fmt.Errorf("the connection ended after %d answers counted", a.answered.Load())
		}
		buf = append(buf[:0], msgs[int(i)%sessions]...)
		binary.BigEndian.PutUint32(buf[12:], i)
		binary.BigEndian.PutUint32(buf[16:], i)
		a.sent[i%ring].Store(int64(time.Since(a.start)))
		if _, err := conn.Write(buf); err != nil {
			return result{}, err
		}
	}
	a.counting.Store(false)
	n := a.answered.Load()
	// The last answers, then DPR and DPA.
	for deadline := time.Now().Add(2 * time.Second); len(a.slots) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	disconnect(conn, origin, a.dpa)
	conn.Close()
	<-a.done
	slices.Sort(a.lat)
	return result{success: n, other: a.refused.Load(), lat: a.lat}, nil
}

// exchangeCapabilities sends a CER and wants a CEA with 2001.
func exchangeCapabilities(conn net.Conn, origin string) error {
	cer := diam.NewRequest(diameter.CmdCapabilitiesExchange, 0, dict.Default)
	diameter.AddCapabilities(cer, origin, "example", "diameterload")
	if _, err := cer.WriteTo(conn); err != nil {
		return err
	}
	if cea, err := diam.ReadMessage(conn, dict.Default); err != nil {
		return fmt.Errorf("CEA: %v", err)
	} else if rc := resultCode(cea); rc != diam.Success {
		return fmt.Errorf("CEA: Result-Code %d", rc)
	}
	return nil
}

// answers is what a client run's reader keeps: a window slot freed per
// answer, the answers counted, and the latencies of those counted.
type answers struct {
	start             time.Time
	sent              [ring]atomic.Int64 // send times since start, by Hop-by-Hop id
	slots             chan struct{}      // one per request in flight
	answered, refused atomic.Int64
	counting          atomic.Bool // past the warm-up, before the end
	lat               []time.Duration
	done, dpa         chan struct{} // the reader ended; the DPA came
}

// read reads answers from conn until it ends or the DPA comes.
func (a *answers) read(conn net.Conn) {
	defer close(a.done)
	fr := diameter.NewFramer(conn, 0, 1<<16)
	var in diameter.Info
	for {
		m, err := fr.Next()
		if err != nil {
			return
		}
		if in.Parse(m) != nil || in.Request {
			continue // a DWR from the front is not answered: runs are shorter than Tw
		}
		if in.Header.CommandCode == diameter.CmdDisconnectPeer {
			close(a.dpa)
			return
		}
		rc := resultCodeRaw(m)
		took := time.Since(a.start) - time.Duration(a.sent[in.Header.HopByHopID%ring].Load())
		switch {
		case rc != diam.Success:
			a.refused.Add(1) // counted during the warm-up too: any refusal is a finding
		case a.counting.Load():
			a.answered.Add(1)
			a.lat = append(a.lat, took)
		}
		<-a.slots
	}
}

// disconnect sends a DPR and waits up to 2 s for dpa to close.
func disconnect(conn net.Conn, origin string, dpa <-chan struct{}) {
	dpr := diam.NewRequest(diameter.CmdDisconnectPeer, 0, dict.Default)
	dpr.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(origin))
	dpr.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example"))
	dpr.NewAVP(avp.DisconnectCause, avp.Mbit, 0, datatype.Enumerated(0))
	dpr.WriteTo(conn)
	select {
	case <-dpa:
	case <-time.After(2 * time.Second):
	}
}

// resultCode is m's Result-Code, or 0 when it has none.
func resultCode(m *diam.Message) uint32 {
	a, err := m.FindAVP(avp.ResultCode, 0)
	if err != nil {
		return 0
	}
	if v, ok := a.Data.(datatype.Unsigned32); ok {
		return uint32(v)
	}
	return 0
}

// resultCodeRaw is the Result-Code among msg's top-level AVPs, or 0.
func resultCodeRaw(msg []byte) uint32 {
	for off := diam.HeaderLength; off+8 <= len(msg); {
		code := binary.BigEndian.Uint32(msg[off:])
		l := int(binary.BigEndian.Uint32(msg[off+4:]) & 0xffffff)
		hdr := 8
		if msg[off+4]&avp.Vbit != 0 {
			hdr = 12
		}
		if l < hdr || off+l > len(msg) {
			return 0
		}
		if code == avp.ResultCode && l-hdr == 4 {
			return binary.BigEndian.Uint32(msg[off+hdr:])
		}
		off += (l + 3) &^ 3
	}
	return 0
}
