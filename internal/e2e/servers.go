package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Caddy is a running bin/caddy.
type Caddy struct {
	*Proc
	// Admin is the admin API's address, host:port.
	Admin string
}

// caddyEnv keeps Caddy's storage and autosave inside the test's temp dir and
// puts the admin API on addr unless the config names its own.
func caddyEnv(t testing.TB, admin string) []string {
	home := t.TempDir()
	return []string{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, "config"),
		"XDG_DATA_HOME=" + filepath.Join(home, "data"),
		"CADDY_ADMIN=" + admin,
	}
}

// StartCaddy runs bin/caddy with config, given in adapter's format
// ("caddyfile" or "json"), and waits until its admin API answers. The
// config should leave the admin address unset: the harness picks one.
// Use WaitTCP for listeners the test needs.
func StartCaddy(t testing.TB, adapter, config string) *Caddy {
	t.Helper()
	name := "caddy.json"
	if adapter == "caddyfile" {
		name = "Caddyfile"
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	admin := Addr(t)
	args := []string{"run", "--config", path}
	if adapter != "json" {
		args = append(args, "--adapter", adapter)
	}
	c := &Caddy{Proc: Start(t, "caddy", Bin(t, "caddy"), caddyEnv(t, admin), args...), Admin: admin}
	c.WaitFor(t, "admin API", 60*time.Second, func() error {
		resp, err := http.Get("http://" + admin + "/config/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("admin API: %s", resp.Status)
		}
		return nil
	})
	return c
}

// CaddyCommand returns an exec.Cmd for a one-shot bin/caddy subcommand
// (validate, adapt, list-modules, version) with an isolated environment.
func CaddyCommand(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(Bin(t, "caddy"), args...)
	cmd.Env = append(cmd.Environ(), caddyEnv(t, Addr(t))...)
	return cmd
}

// CoreDNS is a running bin/coredns.
type CoreDNS struct {
	*Proc
	// Addr is the DNS listener, 127.0.0.1:port, on UDP and TCP.
	Addr string
}

// StartCoreDNS runs bin/coredns with corefile, whose server blocks should
// name no port: the harness passes a free one with -dns.port. It waits until
// a query for probe (a name and type, e.g. "example.test. SOA") is answered
// with any response code.
func StartCoreDNS(t testing.TB, corefile, probe string) *CoreDNS {
	t.Helper()
	return StartCoreDNSVia(t, corefile, probe, nil)
}

// StartCoreDNSVia is StartCoreDNS with bin/coredns run through the
// command via (e.g. skewclock's: program and flags, ending in "--").
func StartCoreDNSVia(t testing.TB, corefile, probe string, via []string) *CoreDNS {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	cmd := append(append([]string{}, via...), Bin(t, "coredns"))
	d := &CoreDNS{
		Proc: Start(t, "coredns", cmd[0], nil, append(cmd[1:], "-conf", path, "-dns.port", fmt.Sprint(port))...),
		Addr: fmt.Sprintf("127.0.0.1:%d", port),
	}
	name, qtype := splitProbe(t, probe)
	d.WaitFor(t, "a DNS answer", 30*time.Second, func() error {
		_, err := d.Exchange(name, qtype)
		return err
	})
	return d
}

// Exchange sends one UDP query and returns the response.
func (d *CoreDNS) Exchange(name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, d.Addr)
	return r, err
}

func splitProbe(t testing.TB, probe string) (string, uint16) {
	f := strings.Fields(probe)
	if len(f) != 2 {
		t.Fatalf("probe %q: want \"NAME TYPE\"", probe)
	}
	qtype, ok := dns.StringToType[strings.ToUpper(f[1])]
	if !ok {
		t.Fatalf("probe %q: unknown type %q", probe, f[1])
	}
	return f[0], qtype
}

// StartPeer runs bin/testpeer as its own process on addr; it answers
// GET /probe after probeDelay and everything else at once with name.
func StartPeer(t testing.TB, name, addr string, probeDelay time.Duration) *Proc {
	t.Helper()
	p := Start(t, name, Bin(t, "testpeer"), nil, "-listen", addr, "-name", name, "-probe-delay", probeDelay.String())
	p.WaitTCP(t, addr)
	return p
}

// Slapd is a private OpenLDAP server on a free loopback port, with suffix
// dc=example, rootdn cn=admin,dc=example (password "secret") and the
// entries of ldif.
type Slapd struct {
	*Proc
	Addr string
}

// StartSlapd writes a slapd.conf, loads ldif with slapadd and runs slapd.
func StartSlapd(t testing.TB, name, ldif string) *Slapd {
	t.Helper()
	dir := t.TempDir()
	db := filepath.Join(dir, "db")
	if err := os.MkdirAll(db, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "slapd.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf(`include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile %s/slapd.pid
database mdb
maxsize 104857600
suffix "dc=example"
rootdn "cn=admin,dc=example"
rootpw secret
directory %s
access to attrs=userPassword by anonymous auth by * none
access to * by * read
`, dir, db)), 0o644)
	data := filepath.Join(dir, "data.ldif")
	os.WriteFile(data, []byte(ldif), 0o644)
	if out, err := exec.Command("slapadd", "-f", conf, "-l", data).CombinedOutput(); err != nil {
		t.Fatalf("slapadd: %v\n%s", err, out)
	}
	port := FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s := &Slapd{Proc: Start(t, name, "slapd", nil, "-f", conf, "-h", "ldap://"+addr+"/", "-d", "0"), Addr: addr}
	s.WaitTCP(t, addr)
	return s
}

// StartEtcd runs a single-member etcd (Debian's etcd-server) on free
// loopback ports and returns its client URL.
func StartEtcd(t testing.TB) (*Proc, string) {
	t.Helper()
	return StartEtcdAt(t, t.TempDir(), Addr(t), Addr(t))
}

// StartEtcdAt runs a single-member etcd with its data under dir, on the
// given client and peer addresses, so that a test can stop it and start it
// again as the same server with the same data.
func StartEtcdAt(t testing.TB, dir, client, peer string) (*Proc, string) {
	t.Helper()
	clientURL, peerURL := "http://"+client, "http://"+peer
	p := Start(t, "etcd", "etcd", nil,
		"--name", "n1", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "n1="+peerURL, "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn")
	p.WaitFor(t, "etcd health", 30*time.Second, func() error {
		resp, err := http.Get(clientURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("health: %s", resp.Status)
		}
		return nil
	})
	return p, clientURL
}

// ValidateFails runs `caddy validate` on a Caddyfile and fails the test
// unless validation fails with a message containing want (quotes in the
// JSON log line unescaped).
func ValidateFails(t testing.TB, caddyfile, want string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := CaddyCommand(t, "validate", "--adapter", "caddyfile", "--config", path).CombinedOutput()
	text := strings.ReplaceAll(string(out), `\"`, `"`)
	if err == nil || !strings.Contains(text, want) {
		t.Fatalf("want a failure containing %q; err=%v\n%s", want, err, out)
	}
}
