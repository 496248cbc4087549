package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var topologies atomic.Int32

// Topology is a set of network namespaces made by a test, one per host, all
// on one bridge (in a namespace of its own) in 10.77.0.0/24. Nothing in it
// touches the machine's own network. It is removed when the test ends.
type Topology struct {
	prefix string
	ips    map[string]string
}

// NewTopology makes one namespace per host, host → last octet of its
// address. It needs root and iproute2.
func NewTopology(t testing.TB, hosts map[string]int) *Topology {
	t.Helper()
	SkipShort(t)
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip is needed (Debian package iproute2; make test installs it)")
	}
	tp := &Topology{prefix: fmt.Sprintf("es%d-%d", os.Getpid()%100000, topologies.Add(1)), ips: map[string]string{}}
	names := make([]string, 0, len(hosts))
	for h := range hosts {
		names = append(names, h)
	}
	sort.Strings(names)
	bridge := tp.prefix + "-br"
	tp.ip(t, "netns", "add", bridge)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", bridge).Run() })
	tp.ip(t, "-n", bridge, "link", "add", "br0", "type", "bridge")
	tp.ip(t, "-n", bridge, "link", "set", "br0", "up")
	for i, h := range names {
		ns := tp.NS(h)
		tp.ip(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		port := fmt.Sprintf("p%d", i)
		tp.ip(t, "-n", bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		tp.ip(t, "-n", bridge, "link", "set", port, "master", "br0", "up")
		tp.ips[h] = fmt.Sprintf("10.77.0.%d", hosts[h])
		tp.ip(t, "-n", ns, "addr", "add", tp.ips[h]+"/24", "dev", "eth0")
		tp.ip(t, "-n", ns, "link", "set", "eth0", "up")
		tp.ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	return tp
}

// NewNamespace makes one empty network namespace with only its loopback
// up (all of 127.0.0.0/8 is local there) and returns its name; it is
// removed when the test ends. Servers started inside it on fixed loopback
// ports collide with nothing on the machine. It needs root and iproute2.
func NewNamespace(t testing.TB) string {
	t.Helper()
	SkipShort(t)
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root")
	}
	tp := &Topology{prefix: fmt.Sprintf("es%d-%d", os.Getpid()%100000, topologies.Add(1))}
	ns := tp.prefix + "-solo"
	tp.ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	tp.ip(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// InNamespace runs the calling test again, alone, as a child test process
// inside a fresh namespace (NewNamespace) with the given sysctls set there
// ("net.ipv4.tcp_migrate_req=1"), and reports whether the caller is that
// child: the parent returns false once the child has passed (its output is
// shown when it fails; its own log lines are logged), the child checks the
// sysctls and returns true, and goes on with the test. Everything the test
// does, its servers and its clients, then shares that namespace, its fixed
// ports and its settings, and nothing of the machine's is changed.
func InNamespace(t *testing.T, sysctls ...string) bool {
	t.Helper()
	const marker = "EDGESTEER_TEST_NAMESPACE"
	if os.Getenv(marker) != "" {
		for _, kv := range sysctls {
			k, v, _ := strings.Cut(kv, "=")
			got, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
			if err != nil || strings.TrimSpace(string(got)) != v {
				t.Fatalf("%s in the test's namespace: %q %v", kv, got, err)
			}
		}
		return true
	}
	Bin(t, "caddy") // build once, here, so the child finds the binaries built
	ns := NewNamespace(t)
	for _, kv := range sysctls {
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
			t.Fatalf("sysctl %s in %s: %v\n%s", kv, ns, err, out)
		}
	}
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0],
		"-test.run", "^"+t.Name()+"$", "-test.count", "1", "-test.v", "-test.timeout", "15m")
	cmd.Env = append(os.Environ(), marker+"="+ns)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in namespace %s: %v\n%s", t.Name(), ns, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in namespace %s did not run:\n%s", t.Name(), ns, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "_test.go:") {
			t.Log(strings.TrimSpace(line))
		}
	}
	return false
}

func (tp *Topology) ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// NS is the namespace name of host.
func (tp *Topology) NS(host string) string { return tp.prefix + "-" + host }

// IP is host's address.
func (tp *Topology) IP(host string) string { return tp.ips[host] }

// Run runs a command inside host's namespace and fails the test if it fails.
func (tp *Topology) Run(t testing.TB, host, bin string, args ...string) {
	t.Helper()
	if out, err := tp.Command(host, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(append([]string{bin}, args...), " "), host, err, out)
	}
}

// Command returns a command that runs inside host's namespace.
func (tp *Topology) Command(host, bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", tp.NS(host), bin}, args...)...)
}

// Start runs a program inside host's namespace (ip netns exec replaces
// itself with the program, so the process is the program).
func (tp *Topology) Start(t testing.TB, host, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	return Start(t, name, "ip", env, append([]string{"netns", "exec", tp.NS(host), bin}, args...)...)
}

// StartCaddy runs bin/caddy in host's namespace with a Caddyfile, from dir
// (relative paths in the config are relative to it), its admin API on the
// namespace's own 127.0.0.1:2019, and waits until that answers.
func (tp *Topology) StartCaddy(t testing.TB, host, caddyfile, dir string, env []string) *Proc {
	t.Helper()
	return tp.StartCaddyVia(t, host, caddyfile, dir, env, nil)
}

// StartCaddyVia is StartCaddy with bin/caddy run through a launcher: via
// is the launcher's command line up to the program it runs (e.g.
// skewclock's, from skew.Args without the program).
func (tp *Topology) StartCaddyVia(t testing.TB, host, caddyfile, dir string, env, via []string) *Proc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(caddyEnv(t, "127.0.0.1:2019"), env...)
	args := append([]string{"netns", "exec", tp.NS(host), "env", "--chdir=" + dir}, via...)
	args = append(args, Bin(t, "caddy"), "run", "--adapter", "caddyfile", "--config", path)
	p := Start(t, "caddy@"+host, "ip", env, args...)
	client := tp.HTTPClient(host)
	p.WaitFor(t, "admin API in "+host, 60*time.Second, func() error {
		resp, err := client.Get("http://127.0.0.1:2019/config/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	return p
}

// Metric scrapes the admin API's /metrics of the Caddy that StartCaddy runs
// in host's namespace and returns series' value (see Caddy.Metric).
func (tp *Topology) Metric(t testing.TB, host, series string) (value float64, ok bool) {
	t.Helper()
	return tp.MetricAt(t, host, "http://127.0.0.1:2019/metrics", series)
}

// HTTPClient returns a client whose connections are made inside host's
// namespace (without keep-alive, so each request is a new connection).
func (tp *Topology) HTTPClient(host string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:       tp.Dialer(host, nil),
			DisableKeepAlives: true,
		},
	}
}

// Dialer returns a dial function whose sockets are created inside host's
// namespace, from local (nil: any) address. A socket stays in the
// namespace it was created in, so only the socket call switches namespace,
// on a locked thread that is switched back after.
func (tp *Topology) Dialer(host string, local net.Addr) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := tp.In(host, func() error {
			var err error
			conn, err = (&net.Dialer{LocalAddr: local}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}
