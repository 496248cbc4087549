package ogs_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// netGateway is an HTTP gateway listening at addr in ns that answers after
// a delay chosen by the client's /28: each client network sees its own
// distance to it.
func netGateway(t *testing.T, tp *e2e.Topology, host, addr string, delays map[string]time.Duration) {
	t.Helper()
	var l net.Listener
	if err := tp.In(host, func() (err error) { l, err = net.Listen("tcp", addr); return }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host).To4()
		network := (&net.IPNet{IP: ip.Mask(net.CIDRMask(28, 32)), Mask: net.CIDRMask(28, 32)}).String()
		time.Sleep(delays[network])
		fmt.Fprintln(w, "ok")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// Two client networks and three gateways in network namespaces, each
// network at other distances from each gateway (the gateways answer after
// a delay chosen by the client's /28), CoreDNS (two replicas sharing one
// redis-server) in a namespace of its own at distances of its own:
//
//	from        gw1     gw2     gw3     order
//	CoreDNS     50 ms  150 ms  250 ms   gw1 gw2 gw3
//	network A  250 ms   50 ms  150 ms   gw2 gw3 gw1
//	network B  150 ms  250 ms   50 ms   gw3 gw1 gw2
//
// Without reports both networks get CoreDNS's own order. Three reporters
// in each network (bin/ogs-report, measuring through the namespaces, all
// six at once) report to replica 1 only; then each network's queries get
// its own order with "source reports" in the TXT, on both replicas. A
// fourth reporter in A claiming gw1 at 1 ms changes nothing; an unknown
// token is refused (exit 3, unauthorized). Replica 2's reload (the reload
// plugin) keeps the aggregates.
func TestReportsPerNetworkInNamespaces(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"dns": 2, "netA": 17, "netB": 33, "gw1": 51, "gw2": 52, "gw3": 53})
	for host, extra := range map[string][]string{"netA": {"10.77.0.18", "10.77.0.19", "10.77.0.20"}, "netB": {"10.77.0.34", "10.77.0.35", "10.77.0.36"}} {
		for _, a := range extra {
			tp.Run(t, host, "ip", "addr", "add", a+"/24", "dev", "eth0")
		}
	}
	const dnsNet, netA, netB = "10.77.0.0/28", "10.77.0.16/28", "10.77.0.32/28"
	for i, d := range [][3]time.Duration{{50 * ms, 250 * ms, 150 * ms}, {150 * ms, 50 * ms, 250 * ms}, {250 * ms, 150 * ms, 50 * ms}} {
		name := fmt.Sprintf("gw%d", i+1)
		netGateway(t, tp, name, tp.IP(name)+":8080", map[string]time.Duration{dnsNet: d[0], netA: d[1], netB: d[2]})
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("branch "+e2eToken+"\nliar liar-token-0123456789abc\n"), 0o600)
	tokenFile, liarFile, badFile := filepath.Join(dir, "token"), filepath.Join(dir, "liar"), filepath.Join(dir, "bad")
	os.WriteFile(tokenFile, []byte(e2eToken+"\n"), 0o600)
	os.WriteFile(liarFile, []byte("liar-token-0123456789abc\n"), 0o600)
	os.WriteFile(badFile, []byte("not-a-known-token-at-all\n"), 0o600)

	tp.Start(t, "dns", "redis", "redis-server", nil, "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no", "--dir", dir)
	corefile := func(admin string, ttl int) string {
		return fmt.Sprintf(`vpn.example.test {
	bind %s
	reload 2s 0s
	ogs {
		gateway gw1.example.test %s:8080
		gateway gw2.example.test %s:8080
		gateway gw3.example.test %s:8080
		probe http /
		prefix 28 56
		ttl %d
		admin %s
		report_tokens %s
		report_rate 50 50
		store redis {
			address 127.0.0.1:6379
		}
	}
}
`, tp.IP("dns"), tp.IP("gw1"), tp.IP("gw2"), tp.IP("gw3"), ttl, admin, tokens)
	}
	type replica struct {
		p      *e2e.Proc
		port   string
		admin  string
		config string
	}
	var reps []*replica
	for i, port := range []string{"53", "5353"} {
		r := &replica{port: port, admin: fmt.Sprintf("%s:%d", tp.IP("dns"), 8053+i), config: filepath.Join(dir, fmt.Sprintf("Corefile%d", i))}
		os.WriteFile(r.config, []byte(corefile(r.admin, 30)), 0o644)
		r.p = tp.Start(t, "dns", fmt.Sprintf("coredns%d", i+1), e2e.Bin(t, "coredns"), nil, "-conf", r.config, "-dns.port", port)
		reps = append(reps, r)
	}
	ask := func(r *replica, host, src, name, qtype string) (string, error) {
		out, err := tp.Command(host, "dig", "@"+tp.IP("dns"), "-p", r.port, "-b", src, name, qtype, "+short", "+tries=1", "+time=5").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	order := func(r *replica, host, src string) string {
		t.Helper()
		out, err := ask(r, host, src, "vpn.example.test", "A")
		if err != nil {
			t.Fatalf("dig from %s: %v\n%s", src, err, out)
		}
		return strings.ReplaceAll(out, "\n", " ")
	}
	ip := func(names ...string) string {
		var out []string
		for _, n := range names {
			out = append(out, tp.IP(n))
		}
		return strings.Join(out, " ")
	}
	own, orderA, orderB := ip("gw1", "gw2", "gw3"), ip("gw2", "gw3", "gw1"), ip("gw3", "gw1", "gw2")
	for _, r := range reps {
		r.p.WaitFor(t, "an answer", 30*time.Second, func() error {
			if got, err := ask(r, "netA", "10.77.0.17", "vpn.example.test", "A"); err != nil || strings.ReplaceAll(got, "\n", " ") != own {
				return fmt.Errorf("network A: %q (%v)", got, err)
			}
			return nil
		})
		if got := order(r, "netB", "10.77.0.33"); got != own {
			t.Fatalf("replica :%s, network B before reports: %q, want CoreDNS's own %q", r.port, got, own)
		}
	}

	report := func(host, src, tokenFile string) (int, string) {
		args := []string{"-url", "http://" + reps[0].admin + "/ogs/reports", "-token-file", tokenFile, "-probe", "http", "-source", src}
		for i := 1; i <= 3; i++ {
			args = append(args, "-gateway", fmt.Sprintf("gw%d.example.test=%s:8080", i, tp.IP(fmt.Sprintf("gw%d", i))))
		}
		out, err := tp.Command(host, e2e.Bin(t, "ogs-report"), args...).CombinedOutput()
		code := 0
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	var wg sync.WaitGroup
	for host, srcs := range map[string][]string{"netA": {"10.77.0.17", "10.77.0.18", "10.77.0.19"}, "netB": {"10.77.0.33", "10.77.0.34", "10.77.0.35"}} {
		for _, src := range srcs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, out := report(host, src, tokenFile); code != 0 {
					t.Errorf("reporter %s: exit %d\n%s", src, code, out)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	check := func(stage string) {
		t.Helper()
		for _, r := range reps {
			r.p.WaitFor(t, stage+": each network its own order", 30*time.Second, func() error {
				if a, b := order(r, "netA", "10.77.0.17"), order(r, "netB", "10.77.0.33"); a != orderA || b != orderB {
					return fmt.Errorf("replica :%s: A %q (want %q), B %q (want %q)", r.port, a, orderA, b, orderB)
				}
				return nil
			})
			for host, src := range map[string]string{"netA": "10.77.0.17", "netB": "10.77.0.33"} {
				if txt, _ := ask(r, host, src, "_ogs.vpn.example.test", "TXT"); !strings.Contains(txt, "source reports") {
					t.Fatalf("%s, replica :%s, %s's TXT: %s", stage, r.port, host, txt)
				}
			}
		}
	}
	check("after the reports")

	// A liar in A: gw1 (A's farthest) at 1 ms.
	body := fmt.Sprintf(`{"probe":"http","time":%q,"gateways":[{"name":"gw1.example.test","rtt_ms":1},{"name":"gw2.example.test","rtt_ms":900},{"name":"gw3.example.test","rtt_ms":900}]}`, time.Now().UTC().Format(time.RFC3339))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: tp.Dialer("netA", &net.TCPAddr{IP: net.ParseIP("10.77.0.20")})}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+reps[0].admin+"/ogs/reports", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer liar-token-0123456789abc")
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the liar's report: %v %v", resp, err)
	}
	resp.Body.Close()
	check("after a liar in A")
	if code, out := report("netB", "10.77.0.36", badFile); code != 3 || !strings.Contains(out, "unauthorized") {
		t.Fatalf("an unknown token: exit %d\n%s", code, out)
	}

	// Replica 2 reloads (another TTL): the aggregates answer on.
	os.WriteFile(reps[1].config, []byte(corefile(reps[1].admin, 40)), 0o644)
	reps[1].p.WaitLog(t, "Reloading complete", 30*time.Second)
	check("after replica 2's reload")
}
