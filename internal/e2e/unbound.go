package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Unbound is a private instance of Debian's unbound, a recursive resolver
// in front of an authoritative server: the zones are stub zones at
// Upstream, and every query it sends there carries EDNS Client Subnet (its
// subnetcache module) with the client's address cut to ECSPrefix bits, the
// way a public resolver tells an authoritative server where its client is.
type Unbound struct {
	Listen    string   // host:port it answers on
	Allow     string   // the clients it answers (a CIDR prefix)
	Upstream  string   // the authoritative server, host:port
	Zones     []string // served by Upstream
	ECSPrefix int      // max-client-subnet-ipv4 (unbound's default: 24)
	// Prime makes the stub zones primed: unbound asks Upstream for their NS
	// records and then asks the servers they name, on port 53 (glue
	// carries no port); unprimed, it asks Upstream itself, on its port.
	Prime     bool
	Verbosity int // unbound's, default 1
}

// Config is the unbound.conf of u, running from dir.
func (u Unbound) Config(dir string) string {
	host, port, _ := net.SplitHostPort(u.Listen)
	up, upPort, _ := net.SplitHostPort(u.Upstream)
	prefix := u.ECSPrefix
	if prefix == 0 {
		prefix = 24
	}
	verbosity := u.Verbosity
	if verbosity == 0 {
		verbosity = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `server:
	verbosity: %d
	interface: %s
	port: %s
	do-ip6: no
	do-daemonize: no
	chroot: ""
	username: ""
	directory: "%s"
	pidfile: "%s/unbound.pid"
	logfile: ""
	use-syslog: no
	access-control: %s allow
	do-not-query-localhost: no
	module-config: "subnetcache validator iterator"
	send-client-subnet: %s
	client-subnet-always-forward: yes
	max-client-subnet-ipv4: %d
`, verbosity, host, port, dir, dir, u.Allow, up, prefix)
	for _, z := range u.Zones {
		fmt.Fprintf(&b, "\tlocal-zone: \"%s.\" transparent\n\tdomain-insecure: \"%s.\"\n", z, z)
	}
	for _, z := range u.Zones {
		fmt.Fprintf(&b, "stub-zone:\n\tname: \"%s.\"\n\tstub-addr: %s@%s\n\tstub-prime: %s\n", z, up, upPort, map[bool]string{true: "yes", false: "no"}[u.Prime])
	}
	return b.String()
}

// WriteConfig writes u's unbound.conf into dir, has unbound-checkconf
// check it, and returns the unbound binary and the config's path.
func (u Unbound) WriteConfig(t testing.TB, dir string) (bin, conf string) {
	t.Helper()
	bin, err := exec.LookPath("unbound")
	if err != nil {
		bin = "/usr/sbin/unbound"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal("unbound is needed (Debian package unbound; make test installs it)")
	}
	conf = filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(conf, []byte(u.Config(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(filepath.Dir(bin), "unbound-checkconf"), conf).CombinedOutput(); err != nil {
		t.Fatalf("unbound-checkconf: %v\n%s\n%s", err, out, u.Config(dir))
	}
	return bin, conf
}

// StartUnbound runs u in host's namespace, in the foreground with a config
// of its own (never the system service), and waits until it takes TCP
// connections on u.Listen.
func (tp *Topology) StartUnbound(t testing.TB, host string, u Unbound) *Proc {
	t.Helper()
	bin, conf := u.WriteConfig(t, t.TempDir())
	p := tp.Start(t, host, "unbound@"+host+"-"+u.Listen, bin, nil, "-d", "-c", conf)
	dial := tp.Dialer(host, nil)
	p.WaitFor(t, "unbound listening", 30*time.Second, func() error {
		c, err := dial(t.Context(), "tcp", u.Listen)
		if err == nil {
			c.Close()
		}
		return err
	})
	return p
}
