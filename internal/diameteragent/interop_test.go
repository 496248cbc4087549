package diameteragent

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
	"github.com/fiorix/go-diameter/v4/diam/sm"
	"github.com/fiorix/go-diameter/v4/diam/sm/smparser"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// goDiameterServer is a PCRF built on go-diameter's state machine (its own
// CER/CEA and DWR/DWA handling): it answers CCRs 2001 with its identity.
func goDiameterServer(t *testing.T, host string) string {
	settings := &sm.Settings{OriginHost: datatype.DiameterIdentity(host), OriginRealm: "pcrf.example",
		VendorID: 10415, ProductName: "go-diameter", HostIPAddresses: []datatype.Address{datatype.Address(net.ParseIP("127.0.0.1"))}}
	mux := sm.New(settings)
	mux.HandleFunc("CCR", func(c diam.Conn, m *diam.Message) {
		a := m.Answer(diam.Success)
		a.NewAVP(avp.OriginHost, avp.Mbit, 0, settings.OriginHost)
		a.NewAVP(avp.OriginRealm, avp.Mbit, 0, settings.OriginRealm)
		a.WriteTo(c)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &diam.Server{Network: "tcp", Handler: mux, Dict: dict.Default}
	go srv.Serve(ln)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// Interop with an implementation this package did not write: go-diameter's
// state machine accepts the agent's CER (upstream) and CEA and DWA
// (downstream), and a CCR from a go-diameter client reaches a go-diameter
// PCRF through the agent over TCP, on the real clock.
func TestInteropGoDiameter(t *testing.T) {
	cfg := baseConfig()
	cfg.Peers = []PeerConfig{
		{Host: "pcrf1.example", Realm: "pcrf.example", Address: goDiameterServer(t, "pcrf1.example")},
		{Host: "pcrf2.example", Realm: "pcrf.example", Address: goDiameterServer(t, "pcrf2.example")},
	}
	cfg.Groups = cfg.Groups[:1]
	cfg.Routes = cfg.Routes[:1]
	cfg.Watchdog = 6 * time.Second
	a, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	t.Cleanup(a.Close)
	for _, host := range []string{"pcrf1.example", "pcrf2.example"} {
		u := a.gen.Load().peers[host]
		eventually(t, host+" OKAY", func() bool { return State(u.state.Load()) == StateOkay })
	}
	agentAddr := listen(t, func(c net.Conn) { a.Serve(c) })
	cliSM := sm.New(&sm.Settings{OriginHost: "pgw1.example", OriginRealm: "example.net", VendorID: 10415, ProductName: "pgw",
		HostIPAddresses: []datatype.Address{datatype.Address(net.ParseIP("127.0.0.1"))}})
	answers := make(chan *diam.Message, 16)
	cliSM.HandleFunc("CCA", func(c diam.Conn, m *diam.Message) { answers <- m })
	dwas := make(chan error, 4)
	cliSM.HandleFunc("DWA", func(c diam.Conn, m *diam.Message) {
		dwa := new(smparser.DWA)
		err := dwa.Parse(m)
		if err == nil && dwa.ResultCode != diam.Success {
			err = fmt.Errorf("DWA Result-Code %d", dwa.ResultCode)
		}
		dwas <- err
	})
	// go-diameter's own client watchdog is not used: its DWA handler drops
	// an answer that comes before its sender waits for it.
	cli := &sm.Client{Dict: dict.Default, Handler: cliSM,
		AuthApplicationID: []*diam.AVP{diam.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGy))},
		VendorSpecificApplicationID: []*diam.AVP{diam.NewAVP(avp.VendorSpecificApplicationID, avp.Mbit, 0, &diam.GroupedAVP{AVP: []*diam.AVP{
			diam.NewAVP(avp.VendorID, avp.Mbit, 0, datatype.Unsigned32(10415)),
			diam.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGx)),
		}})}}
	conn, err := cli.DialTimeout(agentAddr, 5*time.Second)
	if err != nil {
		t.Fatalf("go-diameter client's capabilities exchange with the agent: %v", err)
	}
	defer conn.Close()
	errs := cliSM.ErrorReports()
	seen := map[string]bool{}
	for i := range 6 {
		m := diam.NewRequest(diam.CreditControl, diameter.AppGx, dict.Default)
		m.NewAVP(avp.SessionID, avp.Mbit, 0, datatype.UTF8String("pgw1.example;interop;"+string(rune('a'+i))))
		m.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pgw1.example"))
		m.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example.net"))
		m.NewAVP(avp.DestinationRealm, avp.Mbit, 0, datatype.DiameterIdentity("pcrf.example"))
		m.NewAVP(avp.AuthApplicationID, avp.Mbit, 0, datatype.Unsigned32(diameter.AppGx))
		m.NewAVP(avp.CCRequestType, avp.Mbit, 0, datatype.Enumerated(1))
		m.NewAVP(avp.CCRequestNumber, avp.Mbit, 0, datatype.Unsigned32(0))
		if _, err := m.WriteTo(conn); err != nil {
			t.Fatal(err)
		}
		select {
		case ans := <-answers:
			rc, err := ans.FindAVP(avp.ResultCode, 0)
			oh, err2 := ans.FindAVP(avp.OriginHost, 0)
			if err != nil || err2 != nil || rc.Data.(datatype.Unsigned32) != diam.Success || ans.Header.EndToEndID != m.Header.EndToEndID {
				t.Fatalf("CCA %v", ans)
			}
			seen[string(oh.Data.(datatype.DiameterIdentity))] = true
		case e := <-errs:
			t.Fatalf("go-diameter client error: %v", e.Error)
		case <-time.After(5 * time.Second):
			t.Fatal("no CCA")
		}
	}
	if !seen["pcrf1.example"] || !seen["pcrf2.example"] {
		t.Fatalf("answered by %v", seen)
	}
	dwr := diam.NewRequest(diam.DeviceWatchdog, 0, dict.Default)
	dwr.NewAVP(avp.OriginHost, avp.Mbit, 0, datatype.DiameterIdentity("pgw1.example"))
	dwr.NewAVP(avp.OriginRealm, avp.Mbit, 0, datatype.DiameterIdentity("example.net"))
	if _, err := dwr.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-dwas:
		if err != nil {
			t.Fatalf("go-diameter's reading of the agent's DWA: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no DWA")
	}
	if n := len(a.View().Downstreams); n != 1 {
		t.Fatalf("%d downstream peers after the DWR", n)
	}
}
