package ogs_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// countingGateway is an HTTP gateway on ip that answers after delay and
// counts the connections it accepts: one per probe (probes use a fresh
// connection each).
type countingGateway struct {
	Addr  string
	conns atomic.Int64
	delay atomic.Int64 // ns
}

func (g *countingGateway) Conns() int64 { return g.conns.Load() }

func startCountingGateway(t *testing.T, ip string, delay time.Duration) *countingGateway {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	g := &countingGateway{Addr: l.Addr().String()}
	g.delay.Store(int64(delay))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Duration(g.delay.Load()))
			fmt.Fprintln(w, "ok")
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				g.conns.Add(1)
			}
		},
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return g
}

// reloadable is bin/coredns started by the test itself (the shared harness
// keeps the pid and the Corefile's path to itself): SIGUSR1 and rewriting
// the Corefile reload it.
type reloadable struct {
	cmd  *exec.Cmd
	path string
	addr string
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (r *reloadable) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(p)
}

func (r *reloadable) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

func startReloadable(t *testing.T, corefile string) *reloadable {
	t.Helper()
	r := &reloadable{path: filepath.Join(t.TempDir(), "Corefile"), done: make(chan struct{})}
	if err := os.WriteFile(r.path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	port := e2e.FreePort(t)
	r.addr = fmt.Sprintf("127.0.0.1:%d", port)
	r.cmd = exec.Command(e2e.Bin(t, "coredns"), "-conf", r.path, "-dns.port", fmt.Sprint(port))
	r.cmd.Stdout, r.cmd.Stderr = r, r
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
			r.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("--- coredns output:\n%s", r.logs())
		}
	})
	r.waitFor(t, "a DNS answer", func() bool {
		m := new(dns.Msg)
		m.SetQuestion("ready.invalid.", dns.TypeA)
		_, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, r.addr)
		return err == nil
	})
	return r
}

func (r *reloadable) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		select {
		case <-r.done:
			t.Fatalf("coredns exited while waiting for %s", what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reload triggers a reload (SIGUSR1, or nothing: the reload plugin notices
// the rewritten Corefile) and waits until it completed.
func (r *reloadable) reload(t *testing.T, corefile string, signal bool) {
	t.Helper()
	n := strings.Count(r.logs(), "Reloading complete")
	if corefile != "" {
		if err := os.WriteFile(r.path, []byte(corefile), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if signal {
		r.cmd.Process.Signal(syscall.SIGUSR1)
	}
	r.waitFor(t, "completed reload", func() bool { return strings.Count(r.logs(), "Reloading complete") > n })
}

// ask queries name from the ECS subnet (empty: none) over UDP.
func ask(t *testing.T, addr, name string, qtype uint16, subnet string) *dns.Msg {
	t.Helper()
	resp, err := exchange(addr, name, qtype, subnet)
	if err != nil {
		t.Fatalf("%s from %q: %v", name, subnet, err)
	}
	return resp
}

func exchange(addr, name string, qtype uint16, subnet string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false) // as dig does: the TXT results outgrow 512 bytes
	if subnet != "" {
		_, n, _ := net.ParseCIDR(subnet)
		ones, _ := n.Mask.Size()
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: uint8(ones), Address: n.IP.To4()})
	}
	resp, _, err := (&dns.Client{Timeout: 15 * time.Second}).Exchange(m, addr)
	return resp, err
}

func aRecords(m *dns.Msg) (ips []string, ttl uint32) {
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			ips = append(ips, a.A.String())
			ttl = a.Hdr.Ttl
		}
	}
	return ips, ttl
}

func reloadCorefile(gws []*countingGateway, names []string, ttl int) string {
	var b strings.Builder
	for _, block := range []string{"vpn.example.test", "other.example.test"} {
		fmt.Fprintf(&b, "%s {\n\tbind 127.0.0.1\n\treload 2s 0s\n\togs {\n", block)
		for i, g := range gws {
			if g != nil {
				fmt.Fprintf(&b, "\t\tgateway %s %s\n", names[i], g.Addr)
			}
		}
		// No re-check: every connection counted is a probe run's.
		fmt.Fprintf(&b, "\t\tprobe http /\n\t\tprobes 2\n\t\trecheck off\n\t\tttl %d\n\t}\n}\n", ttl)
	}
	return b.String()
}

func totalConns(gws ...*countingGateway) (n int64) {
	for _, g := range gws {
		n += g.Conns()
	}
	return n
}

// Locations probed before a reload answer after it without a new probe
// reaching any gateway: after SIGUSR1, after the reload plugin picks up a
// changed TTL, and after a gateway is removed. An added gateway makes the
// locations probe again, and the new list answers. A second ogs block,
// same gateways, keeps state of its own.
func TestReloadKeepsLocations(t *testing.T) {
	// 100 ms apart: a loaded machine's probe noise (a 5 ms gateway measured
	// below a 1 ms one in CI) stays inside.
	gw := []*countingGateway{
		startCountingGateway(t, "127.0.0.11", 300*ms),
		startCountingGateway(t, "127.0.0.12", 100*ms),
		startCountingGateway(t, "127.0.0.13", 200*ms),
		startCountingGateway(t, "127.0.0.14", 1*ms),
	}
	names := []string{"gw1", "gw2", "gw3", "gw4"}
	d := startReloadable(t, reloadCorefile([]*countingGateway{gw[0], gw[1], gw[2], nil}, names, 30))
	subnets := []string{"", "10.1.0.0/24", "10.2.0.0/24"}
	want := []string{"127.0.0.12", "127.0.0.13", "127.0.0.11"}
	check := func(stage string, wantIPs []string, wantTTL uint32) {
		t.Helper()
		for _, s := range subnets {
			ips, ttl := aRecords(ask(t, d.addr, "vpn.example.test", dns.TypeA, s))
			if !slices.Equal(ips, wantIPs) || ttl != wantTTL {
				t.Fatalf("%s, location %q: %v ttl %d, want %v ttl %d", stage, s, ips, ttl, wantIPs, wantTTL)
			}
		}
	}
	check("first queries", want, 30)
	probed := totalConns(gw...)
	if probed != int64(len(subnets)*3*2) {
		t.Fatalf("%d probe connections for %d locations, want 2 per gateway each", probed, len(subnets))
	}

	// The reload plugin first: CoreDNS 1.15 drops its watcher after a
	// SIGUSR1 reload (the signal handler purges the event hooks).
	d.reload(t, reloadCorefile([]*countingGateway{gw[0], gw[1], gw[2], nil}, names, 60), false)
	check("after the reload plugin's reload (ttl 60)", want, 60)
	if n := totalConns(gw...); n != probed {
		t.Fatalf("Corefile reload: %d new probe connections", n-probed)
	}

	d.reload(t, "", true)
	check("after SIGUSR1", want, 60)
	if n := totalConns(gw...); n != probed {
		t.Fatalf("SIGUSR1 reload: %d new probe connections", n-probed)
	}
	txt := ask(t, d.addr, "_ogs.vpn.example.test", dns.TypeTXT, "10.1.0.0/24")
	if len(txt.Answer) != 1 || !strings.Contains(strings.Join(txt.Answer[0].(*dns.TXT).Txt, "|"), "Results obtained from OGS cache") {
		t.Fatalf("TXT after reload: %v", txt.Answer)
	}

	// Removing gw3: gone from the answers, the others' RTTs stand.
	d.reload(t, reloadCorefile([]*countingGateway{gw[0], gw[1], nil, nil}, names, 60), true)
	check("after removing gw3", []string{"127.0.0.12", "127.0.0.11"}, 60)
	if n := totalConns(gw...); n != probed {
		t.Fatalf("removing a gateway: %d new probe connections", n-probed)
	}

	// Adding gw4 (the fastest): every location probes again, gw4 first.
	d.reload(t, reloadCorefile([]*countingGateway{gw[0], gw[1], nil, gw[3]}, names, 60), true)
	gw3 := gw[2].Conns()
	check("after adding gw4", []string{"127.0.0.14", "127.0.0.12", "127.0.0.11"}, 60)
	if n := gw[3].Conns(); n != int64(len(subnets)*2) {
		t.Fatalf("gw4 saw %d probe connections, want 2 per location", n)
	}
	if gw[2].Conns() != gw3 {
		t.Fatal("the removed gw3 was probed")
	}

	// The other block's state is its own: the same location probes there.
	before := totalConns(gw...)
	ask(t, d.addr, "other.example.test", dns.TypeA, "10.1.0.0/24")
	if totalConns(gw...) == before {
		t.Fatal("other.example.test answered from vpn.example.test's state")
	}
}

// A probe run in flight when a reload happens is neither lost nor repeated:
// the query waiting on it is answered by it, and a query arriving once the
// new configuration has adopted the state waits for the same run. (CoreDNS
// stops the old server, which closes its copy of the sockets and then waits
// for its queries in flight, only after the new one serves; so the reload
// completes only once the run has, and a query on the old server waiting
// longer than CoreDNS's 5 s grace loses its answer: the run here is 2.4 s,
// and the answer deadline is raised above it so that both queries wait.)
func TestReloadDuringProbeRun(t *testing.T) {
	slow := startCountingGateway(t, "127.0.0.11", 2400*ms)
	fast := startCountingGateway(t, "127.0.0.12", 5*ms)
	cf := fmt.Sprintf("vpn.example.test {\n\tbind 127.0.0.1\n\togs {\n\t\tgateway gw1 %s\n\t\tgateway gw2 %s\n\t\tprobe http /\n\t\tprobes 2\n\t\trecheck off\n\t\tdeadline 20s\n\t\tprobe_timeout 10s\n\t\tanswer_deadline 15s\n\t}\n}\n", slow.Addr, fast.Addr)
	d := startReloadable(t, cf)

	answers := make(chan []string, 2)
	query := func(which string) {
		resp, err := exchange(d.addr, "vpn.example.test", dns.TypeA, "10.7.0.0/24")
		if err != nil {
			t.Errorf("%s query: %v", which, err)
			answers <- nil
			return
		}
		ips, _ := aRecords(resp)
		answers <- ips
	}
	go query("first")
	d.waitFor(t, "the first probe at the slow gateway", func() bool { return slow.Conns() >= 1 })
	d.cmd.Process.Signal(syscall.SIGUSR1)
	d.waitFor(t, "the new configuration", func() bool { return strings.Contains(d.logs(), "adopted from the previous configuration") })
	if len(answers) > 0 {
		t.Fatal("the probe run (2.4 s) finished before the new configuration started")
	}
	go query("second")
	for range 2 {
		if ips := <-answers; !slices.Equal(ips, []string{"127.0.0.12", "127.0.0.11"}) {
			t.Fatalf("answer %v, want the probed order", ips)
		}
	}
	d.waitFor(t, "completed reload", func() bool { return strings.Contains(d.logs(), "Reloading complete") })
	if s, f := slow.Conns(), fast.Conns(); s != 2 || f != 2 {
		t.Fatalf("probe connections slow %d fast %d, want one run of 2 each", s, f)
	}
	if n := strings.Count(d.logs(), "Selected 'gw2'"); n != 1 {
		t.Fatalf("%d probe runs logged, want 1", n)
	}
}

// Two ogs blocks may not share a state name, nor a cache file.
func TestStateNameSharedFails(t *testing.T) {
	for _, tc := range []struct{ opt, want string }{
		{"state x", `state "x": already used`},
		{"cache_file " + filepath.Join(t.TempDir(), "ogs.json"), "already used by another ogs block"},
	} {
		cf := fmt.Sprintf("a.example.test {\n\togs {\n\t\tgateway a 127.0.0.1:1\n\t\t%[1]s\n\t}\n}\nb.example.test {\n\togs {\n\t\tgateway a 127.0.0.1:1\n\t\t%[1]s\n\t}\n}\n", tc.opt)
		path := filepath.Join(t.TempDir(), "Corefile")
		os.WriteFile(path, []byte(cf), 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, e2e.Bin(t, "coredns"), "-conf", path, "-dns.port", fmt.Sprint(e2e.FreePort(t)))
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: err %v:\n%s", tc.opt, err, out)
		}
	}
}
