package diameteragent

import (
	"testing"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// rar is a Re-Auth-Request a PCRF sends to destHost.
func rar(t *testing.T, destHost string, hbh uint32, routeRecords ...string) []byte {
	m := diam.NewMessage(258, diam.RequestFlag|diam.ProxiableFlag, diameter.AppGx, hbh, 0x5555, dict.Default)
	m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("gx;rar"))
	m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pcrf1.example"))
	m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("pcrf.example"))
	m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity("example.net"))
	m.NewAVP(avp.DestinationHost, avp.Mbit, 0, datatype.DiameterIdentity(destHost))
	for _, r := range routeRecords {
		m.NewAVP(avp.RouteRecord, avp.Mbit, 0, datatype.DiameterIdentity(r))
	}
	b, err := m.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answersAt returns the answers to server-initiated requests a server got.
func (s *server) answers(cmd uint32) []message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []message
	for _, m := range s.got {
		if m.cmd == cmd && m.flags&diam.RequestFlag == 0 {
			out = append(out, m)
		}
	}
	return out
}

// A RAR from a PCRF reaches the pGW its Destination-Host names, with the
// agent's Hop-by-Hop id and a Route-Record naming the PCRF; the pGW's RAA
// goes back to the PCRF with the PCRF's Hop-by-Hop id. A RAR for a host not
// connected, or looping, is answered by the agent.
func TestServerInitiatedRequests(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c1, c2 := h.connect("pgw1.example"), h.connect("pgw2.example")
	p1 := h.srv["pcrf1.example"]
	p1.write(rar(t, "PGW2.example", 0x77))
	got := <-c2.reqs
	if got.cmd != 258 || got.hbh == 0x77 || got.e2e != 0x5555 || got.routeRecord != 1 {
		t.Fatalf("pgw2 got %+v", got.in.hdr)
	}
	select {
	case m := <-c1.reqs:
		t.Fatalf("pgw1 got %d", m.cmd)
	default:
	}
	c2.send(answerTo(t, got, ResultSuccess, "pgw2.example"))
	eventually(t, "RAA at the PCRF", func() bool { return len(p1.answers(258)) == 1 })
	if raa := p1.answers(258)[0]; raa.hbh != 0x77 || raa.result != ResultSuccess || raa.origin != "pgw2.example" {
		t.Fatalf("RAA %+v", raa.in.hdr)
	}
	p1.write(rar(t, "pgw9.example", 0x78))
	p1.write(rar(t, "pgw1.example", 0x79, "dra.example"))
	eventually(t, "agent's answers", func() bool { return len(p1.answers(258)) == 3 })
	for _, a := range p1.answers(258)[1:] {
		want := uint32(ResultUnableToDeliver)
		if a.hbh == 0x79 {
			want = ResultLoopDetected
		}
		if a.result != want || a.origin != "dra.example" {
			t.Errorf("RAR %#x answered %d by %s", a.hbh, a.result, a.origin)
		}
	}
}

// A pGW that disconnects with a RAR unanswered: the PCRF gets 3002.
func TestServerInitiatedDownstreamGone(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	p1 := h.srv["pcrf1.example"]
	p1.write(rar(t, "pgw1.example", 0x80))
	<-c.reqs
	c.conn.Close()
	eventually(t, "3002 to the PCRF", func() bool { return len(p1.answers(258)) == 1 })
	if a := p1.answers(258)[0]; a.result != ResultUnableToDeliver || a.hbh != 0x80 {
		t.Fatalf("answer %d hbh %#x", a.result, a.hbh)
	}
}
