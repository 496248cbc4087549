package diameteragent_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// freeDiameterConf writes the configuration of a freeDiameter relay (TCP
// only, Tw 6 s, the TLS files it wants even unused, peers allowed to dial
// it by identity) and returns its path.
func freeDiameterConf(t *testing.T, identity, realm, listen, allow, extra string) string {
	t.Helper()
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: identity},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, DNSNames: []string{identity}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	files := map[string]string{
		"cert.pem": string(pemBlock("CERTIFICATE", der)),
		"key.pem":  string(pemBlock("EC PRIVATE KEY", kder)),
		"acl.conf": "ALLOW_IPSEC " + allow + "\n",
	}
	files["fd.conf"] = fmt.Sprintf(`Identity = %q;
Realm = %q;
Port = 3868;
SecPort = 0;
No_SCTP;
No_IPv6;
ListenOn = %q;
TwTimer = 6;
TLS_Cred = "%[4]s/cert.pem", "%[4]s/key.pem";
TLS_CA = "%[4]s/cert.pem";
LoadExtension = "/usr/lib/freeDiameter/acl_wl.fdx" : "%[4]s/acl.conf";
LoadExtension = "/usr/lib/freeDiameter/dbg_msg_dumps.fdx" : "0x0040";
%s
`, identity, realm, listen, dir, extra)
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "fd.conf")
}

// TestFreeDiameterInterop: bin/caddy's agent with Debian's freeDiameter, an
// implementation this project did not write, in both roles, in a topology of
// network namespaces (freeDiameter will not run on loopback alone):
//
//	pgw1 → fdc (freeDiameter) → agent → pcrf1 (go-diameter)      Gx
//	pgw2 ───────────────────────→ agent → fds (freeDiameter) → ocs1    Gy
//
// fdc dials the agent as a downstream client and routes pgw1's Gx requests
// to it by realm; the agent dials fds as an upstream server, which relays
// the Gy requests to ocs1. Asserted: the capability exchange both ways
// (fds was offered only Gy, per its peer table entry), requests routed
// through, a watchdog exchange each way on the same connections (Tw 6 s on
// all sides) with requests still routed after, fdc's DPR answered when it
// stops, and the agent's DPR to fds and to pgw2 when Caddy stops.
func TestFreeDiameterInterop(t *testing.T) {
	e2e.SkipShort(t)
	if _, err := exec.LookPath("freeDiameterd"); err != nil {
		t.Skip("freeDiameterd is missing (Debian package freediameterd; make test installs it)")
	}
	if _, err := os.Stat("/usr/lib/freeDiameter/acl_wl.fdx"); err != nil {
		t.Fatal("freeDiameter's acl_wl extension is missing (Debian package freediameter-extensions)")
	}
	tp := e2e.NewTopology(t, map[string]int{"agent": 1, "fdc": 2, "fds": 3, "pgw": 4})
	agentIP, fdsIP := tp.IP("agent"), tp.IP("fds")
	testpeer := e2e.Bin(t, "testpeer")
	pcrf1 := tp.Start(t, "agent", "pcrf1.example", testpeer, nil, "-listen", "127.0.0.1:8081", "-name", "pcrf1.example",
		"-diameter", "127.0.0.1:3871", "-realm", "operator.example")
	ocs1 := tp.Start(t, "fds", "ocs1.example", testpeer, nil, "-listen", "127.0.0.1:8081", "-name", "ocs1.example",
		"-diameter", fdsIP+":3870", "-realm", "ocs.example")
	for _, p := range []*e2e.Proc{pcrf1, ocs1} { // fds dials ocs1 at once, and again only Tc later
		p.WaitFor(t, "listening", 10*time.Second, func() error {
			if !strings.Contains(p.Logs(), "Diameter on") {
				return fmt.Errorf("not yet")
			}
			return nil
		})
	}
	fds := tp.Start(t, "fds", "freeDiameterd fds", "freeDiameterd", nil, "-c", freeDiameterConf(t, "fds.example", "relay.example",
		fdsIP, "dra.example", fmt.Sprintf(`ConnectPeer = "ocs1.example" { ConnectTo = %q; Port = 3870; No_TLS; TcTimer = 2; };`, fdsIP)))
	caddy := tp.StartCaddy(t, "agent", fmt.Sprintf(`{
	layer4 {
		%s:3868 {
			route {
				diameter_agent dra {
					origin_host dra.example
					origin_realm operator.example
					host_ip_address %s
					vendor_id 10415
					application 16777238 vendor 10415
					application 4
					peer pcrf1.example {
						realm operator.example
						address 127.0.0.1:3871
						applications 16777238
					}
					peer fds.example {
						realm relay.example
						address %s:3868
						applications 4
					}
					group pcrf {
						peers pcrf1.example
					}
					group ocs {
						peers fds.example
					}
					route operator.example pcrf 16777238
					route ocs.example ocs 4
					watchdog 6s
					reconnect 200ms 1s
				}
			}
		}
	}
}
`, agentIP, agentIP, fdsIP), t.TempDir(), nil)
	fdc := tp.Start(t, "fdc", "freeDiameterd fdc", "freeDiameterd", nil, "-c", freeDiameterConf(t, "fdc.example", "access.example",
		tp.IP("fdc"), "pgw1.example", fmt.Sprintf(`ConnectPeer = "dra.example" { ConnectTo = %q; Port = 3868; No_TLS; };`, agentIP)))
	admin := tp.HTTPClient("agent")
	view := func() diameteragent.View {
		t.Helper()
		resp, err := admin.Get("http://127.0.0.1:2019/diameter_agent/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var vs []agentView
		if err := json.NewDecoder(resp.Body).Decode(&vs); err != nil || len(vs) != 1 {
			t.Fatalf("admin view: %v %+v", err, vs)
		}
		return vs[0].View
	}
	peer := func(v diameteragent.View, host string) diameteragent.PeerView {
		for _, p := range v.Peers {
			if p.Host == host {
				return p
			}
		}
		t.Fatalf("no peer %s in %+v", host, v.Peers)
		return diameteragent.PeerView{}
	}
	logs := func() string {
		return fmt.Sprintf("fdc:\n%s\nfds:\n%s\ncaddy:\n%s", fdc.Logs(), fds.Logs(), caddy.Logs())
	}
	waitView := func(what string, timeout time.Duration, cond func(diameteragent.View) error) {
		t.Helper()
		caddy.WaitFor(t, what, timeout, func() error { return cond(view()) })
	}
	waitView("CER/CEA with fds (upstream) and fdc (downstream)", 30*time.Second, func(v diameteragent.View) error {
		for _, h := range []string{"pcrf1.example", "fds.example"} {
			if p := peer(v, h); p.State != "OKAY" {
				return fmt.Errorf("%s %s (%s)", h, p.State, p.LastError)
			}
		}
		if len(v.Downstreams) != 1 || v.Downstreams[0].Host != "fdc.example" {
			return fmt.Errorf("downstreams %+v", v.Downstreams)
		}
		return nil
	})
	var pgw1 *pgw
	caddy.WaitFor(t, "fdc routing to the agent", 20*time.Second, func() error {
		if pgw1 == nil { // fdc accepts pgw1 before its own peer is open
			pgw1 = dialPGWVia(t, tp.Dialer("pgw", nil), tp.IP("fdc")+":3868", "pgw1.example")
		}
		a, err := pgw1.call(pgw1.ccr(diameter.AppGx, ccrI, "pgw1;probe", "operator.example"))
		if err == nil && a.result != diam.Success {
			err = fmt.Errorf("%+v", a)
		}
		return err
	})
	pgw2 := dialPGWVia(t, tp.Dialer("pgw", nil), agentIP+":3868", "pgw2.example")
	route := func(when string) {
		t.Helper()
		for _, c := range []struct {
			p          *pgw
			app        uint32
			realm, via string
		}{{pgw1, diameter.AppGx, "operator.example", "pcrf1.example"}, {pgw2, diameter.AppGy, "ocs.example", "ocs1.example"}} {
			id := fmt.Sprintf("%s;%s", c.p.host, when)
			as, err := c.p.session(c.app, id, c.realm, 2, 0)
			if err != nil {
				t.Fatalf("%s: %v\n%s", when, err, logs())
			}
			for i, a := range as {
				if a.result != diam.Success || a.origin != c.via || a.session != id {
					t.Fatalf("%s: %s request %d: %+v, want 2001 from %s\n%s", when, id, i, a, c.via, logs())
				}
			}
		}
	}
	route("before the watchdog")

	// Silence on every link: each side's DWR comes after Tw (6 s, jittered
	// by freeDiameter). dbg_msg_dumps logs each message freeDiameter
	// receives: the agent's DWAs must be among them, at fds (upstream) and
	// fdc (downstream), on the connections opened first.
	start := time.Now()
	const dwa = "RCV from 'dra.example': Device-Watchdog-Answer(280)[----], Length=88"
	waitView("watchdog exchanges", 40*time.Second, func(v diameteragent.View) error {
		p := peer(v, "fds.example")
		if p.State != "OKAY" || len(v.Downstreams) != 2 || v.Downstreams[0].Host != "fdc.example" {
			return fmt.Errorf("fds %s (%s), downstreams %+v\n%s", p.State, p.LastError, v.Downstreams, logs())
		}
		switch {
		case p.DWAReceived < 1:
			return fmt.Errorf("the agent's DWR to fds not answered yet")
		case !strings.Contains(fds.Logs(), dwa):
			return fmt.Errorf("no DWA from the agent at fds yet")
		case !strings.Contains(fdc.Logs(), dwa):
			return fmt.Errorf("no DWA from the agent at fdc yet")
		}
		return nil
	})
	t.Logf("watchdog exchanges both ways in %v", time.Since(start).Round(100*time.Millisecond))
	for name, p := range map[string]*e2e.Proc{"fds": fds, "fdc": fdc} {
		if l := p.Logs(); strings.Count(l, "Connected to 'dra.example'") != 1 || !strings.Contains(l, "DIAMETER_SUCCESS' (2001 (0x7d1)) }, { Origin-Host(264)[-M]=\"dra.example\"") {
			t.Errorf("%s: want one connection with the agent, and its DWA with 2001:\n%s", name, l)
		}
	}
	route("after the watchdog")
	if n := (&server{stats: "127.0.0.1:8081", client: tp.HTTPClient("agent")}).get(t).Connections; n != 1 {
		t.Errorf("pcrf1 accepted %d connections, want 1", n)
	}

	// fdc stops: its DPR is answered and it leaves the agent's peers.
	fdc.Stop()
	waitView("fdc's DPR answered", 10*time.Second, func(v diameteragent.View) error {
		if v.Counts.DownstreamDPR != 1 || len(v.Downstreams) != 1 || v.Downstreams[0].Host != "pgw2.example" {
			return fmt.Errorf("downstream DPRs %d, downstreams %+v", v.Counts.DownstreamDPR, v.Downstreams)
		}
		return nil
	})

	// Caddy stops: the agent's DPR reaches fds and pgw2.
	caddy.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for pgw2.dprs.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if pgw2.dprs.Load() != 1 {
		t.Errorf("pgw2 got %d DPRs from the stopping agent, want 1", pgw2.dprs.Load())
	}
	// freeDiameter logs the DPR, and an error if the agent closed the
	// connection before reading its DPA.
	fds.WaitFor(t, "the agent's DPR at fds", 10*time.Second, func() error {
		if !strings.Contains(fds.Logs(), "Peer 'dra.example' sent a DPR") {
			return fmt.Errorf("not logged")
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(fds.Logs(), "Message discarded") {
		t.Errorf("fds could not deliver a message (its DPA?):\n%s", fds.Logs())
	}
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
