package ogs_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

const ms = time.Millisecond

// gateway i (1-4) listens on 127.0.0.1i and answers every request after its
// delay: the probe exchange, SYN to close, takes that long.
func gateways(t *testing.T, delays ...time.Duration) ([]string, []*e2e.Proc) {
	addrs := make([]string, len(delays))
	procs := make([]*e2e.Proc, len(delays))
	for i, d := range delays {
		addrs[i] = fmt.Sprintf("127.0.0.1%d:%d", i+1, e2e.FreePort(t))
		procs[i] = e2e.Start(t, fmt.Sprintf("gw%d", i+1), e2e.Bin(t, "testpeer"), nil,
			"-listen", addrs[i], "-name", fmt.Sprintf("gw%d", i+1), "-delay", d.String())
		procs[i].WaitTCP(t, addrs[i])
	}
	return addrs, procs
}

func corefile(addrs []string, cacheFile, metricsAddr, extra string) string {
	return fmt.Sprintf(`vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test %s
		gateway gw2.example.test %s backup gw4.example.test
		gateway gw3.example.test %s
		gateway gw4.example.test %s
		probe http /
		cache_file %s
		%s
	}
	prometheus %s
}
`, addrs[0], addrs[1], addrs[2], addrs[3], cacheFile, extra, metricsAddr)
}

func dig(t *testing.T, server string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(server)
	out, err := exec.Command("dig", append([]string{"@" + host, "-p", port, "+tries=1", "+time=10"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	return metricWith(t, addr, name, "")
}

// metricWith sums the samples of name whose line contains label.
func metricWith(t *testing.T, addr, name, label string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(data), "\n") {
		if (strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{")) && strings.Contains(line, label) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

// The worked example through bin/coredns and dig: gw1 302, gw2 132, gw3 506,
// gw4 877 ms; gw2 first, then its backup gw4, then gw1 and gw3 by RTT.
func TestOrderCacheECSRestartAndDeletion(t *testing.T) {
	addrs, _ := gateways(t, 302*ms, 132*ms, 506*ms, 877*ms)
	dir := t.TempDir()
	cacheFile := filepath.Join(dir, "ogs.json")
	metricsAddr := e2e.Addr(t)
	cf := corefile(addrs, cacheFile, metricsAddr, "")
	d := e2e.StartCoreDNS(t, cf, "other.example.test A")
	want := "127.0.0.12\n127.0.0.14\n127.0.0.11\n127.0.0.13\n"

	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short"); got != want {
		t.Fatalf("first answer %q, want %q", got, want)
	}
	if runs := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); runs != 1 {
		t.Fatalf("%v probe runs, want 1", runs)
	}
	// A second query inside the cache lifetime does not probe again.
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short"); got != want {
		t.Fatalf("cached answer %q", got)
	}
	if runs, hits := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"), metric(t, metricsAddr, "coredns_ogs_cache_hits_total"); runs != 1 || hits != 1 {
		t.Fatalf("after a cached answer: %v runs, %v cache hits", runs, hits)
	}
	txt := dig(t, d.Addr, "_ogs.vpn.example.test", "TXT", "+short")
	for _, want := range []string{"Results obtained from OGS cache", "Selected 'gw2.example.test' as the optimal server."} {
		if !strings.Contains(txt, want) {
			t.Fatalf("TXT lacks %q:\n%s", want, txt)
		}
	}
	m := regexp.MustCompile(`gw2.example.test \S+ RTT\(ms\) (\d+)`).FindStringSubmatch(txt)
	if m == nil {
		t.Fatalf("no gw2 RTT in %s", txt)
	}
	if rtt, _ := strconv.Atoi(m[1]); rtt < 132 || rtt > 132+500 {
		t.Fatalf("gw2 RTT %d ms, its real delay is 132 ms", rtt)
	}

	// ECS from two subnets: independent entries, one run each.
	for _, subnet := range []string{"10.1.0.0/24", "10.2.0.0/24", "10.1.0.0/24"} {
		if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet="+subnet); got != want {
			t.Fatalf("ECS %s answer %q", subnet, got)
		}
	}
	if runs := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); runs != 3 {
		t.Fatalf("%v probe runs after two new ECS subnets, want 3", runs)
	}

	// A restart keeps the cache.
	d.Stop()
	if _, err := os.Stat(cacheFile); err != nil {
		t.Fatalf("no cache file after shutdown: %v", err)
	}
	d = e2e.StartCoreDNS(t, cf, "other.example.test A")
	dig(t, d.Addr, "vpn.example.test", "A", "+short")
	dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=10.2.0.0/24")
	if runs, hits := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"), metric(t, metricsAddr, "coredns_ogs_cache_hits_total"); runs != 0 || hits != 2 {
		t.Fatalf("after restart: %v runs, %v hits; want answers from the cache file", runs, hits)
	}

	checkDeletionReprobes(t, d, cacheFile, metricsAddr, want)
}

// checkDeletionReprobes deletes the cache file, which forces a new
// evaluation. The plugin looks at the file every second; until it has
// noticed, the location's TXT still says "from OGS cache", and the first
// TXT query after that probes.
func checkDeletionReprobes(t *testing.T, d *e2e.CoreDNS, cacheFile, metricsAddr, want string) {
	t.Helper()
	os.Remove(cacheFile)
	d.WaitFor(t, "the cache file's deletion noticed", 30*time.Second, func() error {
		if txt := dig(t, d.Addr, "_ogs.vpn.example.test", "TXT", "+short"); strings.Contains(txt, "Results obtained from OGS cache") {
			return fmt.Errorf("still cached: %s", txt)
		}
		return nil
	})
	// The measured order, with the full TTL (not an answer given while the
	// run was still going).
	d.WaitFor(t, "the new probe run's result", 30*time.Second, func() error {
		if out := dig(t, d.Addr, "vpn.example.test", "A", "+noall", "+answer"); !strings.Contains(out, "\t30\tIN\tA\t") {
			return fmt.Errorf("answer %q", out)
		}
		return nil
	})
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short"); got != want {
		t.Fatalf("answer after deletion %q", got)
	}
	if runs := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); runs != 1 {
		t.Fatalf("%v probe runs after deleting the cache file, want 1", runs)
	}
}

// Gateways that never answer: the answer comes at the deadline, with the
// location's previous selection (or the configured order for a new one).
func TestDeadlineFallsBackToPrevious(t *testing.T) {
	addrs, procs := gateways(t, 40*ms, 10*ms, 20*ms, 30*ms)
	metricsAddr := e2e.Addr(t)
	cf := corefile(addrs, filepath.Join(t.TempDir(), "ogs.json"), metricsAddr, "deadline 1s\n\t\tcache_ttl 2s\n\t\tretry 1s")
	d := e2e.StartCoreDNS(t, cf, "other.example.test A")
	// The measured order itself is another test's matter (10 ms apart, it
	// is at the mercy of a busy machine's scheduling): here it is only the
	// previous selection that later answers must repeat.
	previous := dig(t, d.Addr, "vpn.example.test", "A", "+short")
	if got := strings.Fields(previous); len(got) != 4 {
		t.Fatalf("first answer %q, want the four gateways", previous)
	}
	// Replace every gateway by a listener that accepts and never answers.
	for i, p := range procs {
		p.Kill()
		e2e.HangingListener(t, addrs[i])
	}
	time.Sleep(2500 * ms) // the entry expires
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short"); got != previous {
		t.Fatalf("past the deadline %q, want the previous selection %q", got, previous)
	}
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=10.9.0.0/24"); got != "127.0.0.11\n127.0.0.12\n127.0.0.13\n127.0.0.14\n" {
		t.Fatalf("a new location past the deadline got %q, want the configured order", got)
	}
	if fb := metric(t, metricsAddr, "coredns_ogs_fallbacks_total"); fb < 2 {
		t.Fatalf("%v fallbacks counted", fb)
	}
}

// Bad config fails at start, naming the option.
func TestBadConfigFailsAtStart(t *testing.T) {
	for body, want := range map[string]string{
		"gateway a 127.0.0.1:1\n\t\tprobes 0":                                   "probes 0",
		"gateway a 127.0.0.1:1\n\t\tdeadline soon":                              "deadline soon",
		"gateway a 127.0.0.1:1\n\t\tgateway a 127.0.0.2:1":                      "duplicate",
		"gateway a 127.0.0.1:1 backup b":                                        `backup "b"`,
		"gateway a 127.0.0.1:1\n\t\tcolour blue":                                `unknown option "colour"`,
		"gateway a vpn.example.test:443":                                        "must be an IP",
		"gateway a 127.0.0.1:1\n\t\tprobe icmp":                                 "unknown probe kind",
		"probes 3":                                                              "at least one gateway",
		"gateway a 127.0.0.1:1\n\t\tadmin 127.0.0.1:99999":                      `admin 127.0.0.1:99999: bad port "99999"`,
		"gateway a 127.0.0.1:1\n\t\tstore redis {\n\t\t\taddress nohost\n\t\t}": `store redis: address "nohost": want host:port`,
	} {
		cf := fmt.Sprintf("vpn.example.test {\n\tbind 127.0.0.1\n\togs {\n\t\t%s\n\t}\n}\n", body)
		path := filepath.Join(t.TempDir(), "Corefile")
		os.WriteFile(path, []byte(cf), 0o644)
		cmd := exec.Command(e2e.Bin(t, "coredns"), "-conf", path, "-dns.port", strconv.Itoa(e2e.FreePort(t)))
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%q: coredns started", body)
		}
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("%q: err %v, output lacks %q:\n%s", body, err, want, out)
		}
	}
}
