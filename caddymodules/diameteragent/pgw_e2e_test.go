package diameteragent_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
)

// answer is what a pGW read of an answer.
type answer struct {
	result         uint32
	eBit           bool
	origin, errMsg string
	session        string
	olrs           [][]byte // OC-OLRs' data
	loads          int      // Load AVPs
}

// pgw is a downstream client on one connection: it sends requests from
// many goroutines and matches answers by Hop-by-Hop id.
type pgw struct {
	host   string
	conn   net.Conn
	wmu    sync.Mutex
	hbh    atomic.Uint32
	mu     sync.Mutex
	wait   map[uint32]chan answer
	closed chan struct{} // closed when the connection ends
	rars   atomic.Int64  // RARs received (and answered 2001)
	dprs   atomic.Int64  // DPRs received (and answered 2001)
}

func dialPGW(t *testing.T, addr, host string) *pgw {
	t.Helper()
	return dialPGWVia(t, (&net.Dialer{}).DialContext, addr, host)
}

// dialPGWVia is dialPGW with the connection made by dial (e.g. inside a
// network namespace).
func dialPGWVia(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, host string) *pgw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := dial(ctx, "tcp", addr)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	p := &pgw{host: host, conn: conn, wait: map[uint32]chan answer{}, closed: make(chan struct{})}
	t.Cleanup(func() { conn.Close() })
	go p.read()
	cer := diam.NewRequest(diameter.CmdCapabilitiesExchange, 0, dict.Default)
	diameter.AddCapabilities(cer, host, "pgw.example", "pgw")
	if a, err := p.call(cer); err != nil || a.result != diam.Success {
		t.Fatalf("%s: CEA %+v, %v", host, a, err)
	}
	return p
}

// read dispatches answers until the connection ends.
func (p *pgw) read() {
	defer close(p.closed)
	buf := make([]byte, 0, 64<<10)
	fr := diameter.NewFramer(p.conn, 0, 1<<20)
	for {
		msg, err := fr.Next()
		if err != nil {
			return
		}
		buf = append(buf[:0], msg...)
		if buf[4]&diam.RequestFlag != 0 {
			p.answerRequest(buf)
			continue
		}
		hbh := binary.BigEndian.Uint32(buf[12:16])
		a := parseAnswer(buf)
		p.mu.Lock()
		ch := p.wait[hbh]
		delete(p.wait, hbh)
		p.mu.Unlock()
		if ch != nil {
			ch <- a
		}
	}
}

// answerRequest answers a request from its peer (a RAR, a DWR, a DPR)
// with 2001 and the pGW's identity.
func (p *pgw) answerRequest(msg []byte) {
	h, err := diameter.ParseHeader(msg, 1<<20)
	if err != nil {
		return
	}
	switch h.CommandCode {
	case diameter.CmdDisconnectPeer:
		p.dprs.Add(1)
	case cmdRAR:
		p.rars.Add(1)
	}
	in, err := diameter.Classify(msg, h)
	if err != nil {
		return
	}
	b, err := diameter.Refusal(in, diam.Success, p.host, "pgw.example", "")
	if err != nil {
		return
	}
	p.wmu.Lock()
	p.conn.Write(b)
	p.wmu.Unlock()
}

// parseAnswer walks the top-level AVPs of a well-formed message.
func parseAnswer(b []byte) answer {
	a := answer{eBit: b[4]&diam.ErrorFlag != 0}
	for off := 20; off+8 <= len(b); {
		code := binary.BigEndian.Uint32(b[off:])
		flags := b[off+4]
		l := int(binary.BigEndian.Uint32(b[off+4:]) & 0xffffff)
		hdr := 8
		if flags&0x80 != 0 {
			hdr = 12
		}
		if l < hdr || off+l > len(b) {
			break
		}
		data := b[off+hdr : off+l]
		switch code {
		case avp.SessionID:
			a.session = string(data)
		case avp.OriginHost:
			a.origin = string(data)
		case avp.ResultCode:
			a.result = binary.BigEndian.Uint32(data)
		case avp.ErrorMessage:
			a.errMsg = string(data)
		case doic.CodeOLR:
			a.olrs = append(a.olrs, append([]byte(nil), data...))
		case doic.CodeLoad:
			a.loads++
		}
		off += (l + 3) &^ 3
	}
	return a
}

var errClosed = errors.New("connection closed before the answer")

// call sends m and waits for its answer (30 s at most: longer than any
// bound of the agent, 2 × Tw included).
func (p *pgw) call(m *diam.Message) (answer, error) {
	h := p.hbh.Add(1)
	m.Header.HopByHopID, m.Header.EndToEndID = h, h
	b, err := m.Serialize()
	if err != nil {
		return answer{}, err
	}
	ch := make(chan answer, 1)
	p.mu.Lock()
	p.wait[h] = ch
	p.mu.Unlock()
	p.wmu.Lock()
	_, err = p.conn.Write(b)
	p.wmu.Unlock()
	if err != nil {
		return answer{}, err
	}
	select {
	case a := <-ch:
		return a, nil
	case <-p.closed:
		return answer{}, errClosed
	case <-time.After(30 * time.Second):
		return answer{}, fmt.Errorf("no answer to %d in 30s", h)
	}
}

// ccr is a credit-control request of app (Gx or Gy) for realm, with
// extra AVPs (Destination-Host, Route-Record) at the end.
func (p *pgw) ccr(app, reqType uint32, session, realm string, extra ...*diam.AVP) *diam.Message {
	m := diam.NewMessage(diameter.CmdCreditControl, diam.RequestFlag|diam.ProxiableFlag, app, 0, 0, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String(session))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity(p.host))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("pgw.example"))
	m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity(realm))
	m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(app))
	m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(reqType))
	m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
	for _, a := range extra {
		m.AddAVP(a)
	}
	return m
}

// cmdRAR is the Re-Auth-Request's command code.
const cmdRAR = 258

// CC-Request-Type values.
const (
	ccrI = 1
	ccrU = 2
	ccrT = 3
)

// session runs one session: CCR-I, updates CCR-U, CCR-T, each waiting
// for the previous answer, and returns the answers in order.
func (p *pgw) session(app uint32, id, realm string, updates int, pause time.Duration) ([]answer, error) {
	var out []answer
	for i := 0; i < updates+2; i++ {
		typ := uint32(ccrU)
		switch i {
		case 0:
			typ = ccrI
		case updates + 1:
			typ = ccrT
		}
		a, err := p.call(p.ccr(app, typ, id, realm))
		if err != nil {
			return out, fmt.Errorf("session %s request %d: %w", id, i, err)
		}
		out = append(out, a)
		time.Sleep(pause)
	}
	return out, nil
}
