package diameteragent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// freeDiameterConf writes a freeDiameter configuration (Tw 6 s, TCP only,
// the TLS files it wants even unused) and returns its path.
func freeDiameterConf(t *testing.T, identity, realm, listen string, port int, extra string) string {
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
	cert, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	acl := filepath.Join(dir, "acl.conf")
	os.WriteFile(acl, []byte("ALLOW_IPSEC dra.example\n"), 0o600)
	conf := fmt.Sprintf(`Identity = %q;
Realm = %q;
Port = %d;
SecPort = 0;
No_SCTP;
No_IPv6;
ListenOn = %q;
TwTimer = 6;
TLS_Cred = %q, %q;
TLS_CA = %q;
LoadExtension = "/usr/lib/freeDiameter/acl_wl.fdx" : %q;
%s
`, identity, realm, port, listen, cert, keyPath, cert, acl, extra)
	path := filepath.Join(dir, "fd.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Interop with freeDiameter, a real Diameter implementation: upstream, it
// accepts the agent's CER and the connection goes OKAY; over two Tw (6 s)
// the agent's DWR is answered and freeDiameter's own DWRs are answered by
// the agent (it sends the next one), on the same connection, OKAY. Downstream, a freeDiameter that dials
// the agent gets its CEA and its DWRs answered and stays connected.
func TestInteropFreeDiameter(t *testing.T) {
	e2e.SkipShort(t)
	if _, err := exec.LookPath("freeDiameterd"); err != nil {
		t.Fatal("freeDiameterd is needed (Debian package freediameterd; make test installs it)")
	}
	tp := e2e.NewTopology(t, map[string]int{"agent": 1, "fd1": 2, "fd2": 3})
	const agentPort = 3868
	fd1 := tp.Start(t, "fd1", "freeDiameterd fd1", "freeDiameterd", nil, "-c",
		freeDiameterConf(t, "fd1.example", "pcrf.example", tp.IP("fd1"), 3868, ""))
	inAgent := func(f func() error) {
		if err := tp.In("agent", f); err != nil {
			t.Fatal(err)
		}
	}
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = tp.In("agent", func() error {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	cfg := baseConfig()
	cfg.Peers = []PeerConfig{{Host: "fd1.example", Realm: "pcrf.example", Address: net.JoinHostPort(tp.IP("fd1"), "3868")}}
	cfg.Groups = []GroupConfig{{Name: "pcrf", Peers: []string{"fd1.example"}}}
	cfg.Routes = cfg.Routes[:1]
	cfg.Watchdog = 6 * time.Second
	cfg.ReconnectMin = 200 * time.Millisecond
	a, err := New(cfg, Options{Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	var ln net.Listener
	inAgent(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(tp.IP("agent"), fmt.Sprint(agentPort)))
		return err
	})
	t.Cleanup(func() { ln.Close() })
	acceptAll(ln, func(c net.Conn) { a.Serve(c) })
	a.Start() // retries until freeDiameter listens
	fd2 := tp.Start(t, "fd2", "freeDiameterd fd2", "freeDiameterd", nil, "-c",
		freeDiameterConf(t, "fd2.example", "example.net", tp.IP("fd2"), 3868,
			fmt.Sprintf("ConnectPeer = \"dra.example\" { ConnectTo = %q; Port = %d; No_TLS; };", tp.IP("agent"), agentPort)))
	u := a.gen.Load().peers["fd1.example"]
	waitView := func(what string, cond func(View) bool) View {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; {
			v := a.View()
			if cond(v) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: view %+v\nfd1:\n%s\nfd2:\n%s", what, v, fd1.Logs(), fd2.Logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitView("fd1 OKAY", func(v View) bool { return v.Peers[0].State == "OKAY" })
	conn := u.link.Load()
	waitView("fd2 connected", func(v View) bool { return len(v.Downstreams) == 1 && v.Downstreams[0].Host == "fd2.example" })
	// freeDiameter sends a second DWR only if it took the agent's answer to
	// the first (else it goes SUSPECT): two on each connection, and one of
	// the agent's DWRs answered.
	v := waitView("watchdog exchanges", func(v View) bool {
		p := v.Peers[0]
		return p.DWAReceived >= 1 && p.DWRReceived >= 2 && v.Counts.DownstreamDWR >= 2
	})
	if v.Peers[0].State != "OKAY" || u.link.Load() != conn || len(v.Downstreams) != 1 {
		t.Fatalf("after the watchdog exchanges: %+v", v)
	}
}
