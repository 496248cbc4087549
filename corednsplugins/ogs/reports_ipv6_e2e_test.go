package ogs_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

var v6Prefixes atomic.Int32

// loopback6 adds addresses (/128, no duplicate address detection) to lo
// for the test, and removes them when it ends. It needs root and iproute2.
func loopback6(t *testing.T, addrs ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("adding IPv6 addresses to lo needs root")
	}
	for _, a := range addrs {
		if out, err := exec.Command("ip", "-6", "addr", "add", a+"/128", "dev", "lo", "nodad").CombinedOutput(); err != nil {
			t.Fatalf("ip -6 addr add %s: %v\n%s", a, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "-6", "addr", "del", a+"/128", "dev", "lo").Run() })
	}
}

// Client reports from real IPv6 source addresses, through bin/coredns with
// `reports` on an address of its own. The addresses are on lo, in one /48
// per test run: the location is its first /56, and every reporter
// has its own /64 there.
//   - The reports listener serves only POST /ogs/reports (GET /ogs: 404),
//     and the admin listener takes no report (404 no_reports).
//   - Three honest reporters (three tokens) find gw2 nearest; then one
//     liar token reports gw1 at 1 ms from eight /64s of the location.
//     With max_reporters 5 and max_reporters_per_token 2 the liar counts
//     twice, pushes out only its own reporters, and gw2 stays first.
//   - A client rotating its address inside one /64 (fifteen addresses, an
//     unknown token) is one source: beyond report_rate's burst it gets 429
//     rate_limited_source; an address of another /64 is not limited.
func TestReportsIPv6Networks(t *testing.T) {
	e2e.SkipShort(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip is needed (Debian package iproute2; make test installs it)")
	}
	base := fmt.Sprintf("fd41:%x:%x", os.Getpid()%0xffff, v6Prefixes.Add(1)) // a /48
	at := func(subnet, host int) string { return fmt.Sprintf("%s:%x::%x", base, subnet, host) }
	listen := at(0, 0x53)
	honest := []string{at(1, 1), at(2, 1), at(3, 1)}
	var liar, flooder []string
	for i := range 8 {
		liar = append(liar, at(0x10+i, 1))
	}
	for i := range 15 {
		flooder = append(flooder, at(0x20, i+1))
	}
	other := at(0x21, 1)
	loopback6(t, slices.Concat([]string{listen, other}, honest, liar, flooder)...)

	addrs, _ := gateways(t, 30*ms, 120*ms, 200*ms, 250*ms)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	tok := map[string]string{"h1": "honest-1-token-0123456789", "h2": "honest-2-token-0123456789", "h3": "honest-3-token-0123456789", "liar": "liar-token-0123456789abc"}
	writeTokens(t, tokens, tok)
	admin, metrics := e2e.Addr(t), e2e.Addr(t)
	reports := net.JoinHostPort(listen, fmt.Sprint(e2e.FreePort(t)))
	r := startReloadable(t, corefile(addrs, filepath.Join(dir, "ogs.json"), metrics, "admin "+admin+"\n\t\treports "+reports+
		"\n\t\treport_tokens "+tokens+"\n\t\treport_rate 1 10\n\t\tmax_reporters 5\n\t\tmax_reporters_per_token 2"))
	r.waitFor(t, "the reports listener", func() bool {
		c, err := net.Dial("tcp", reports)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	ecs := "+subnet=" + base + "::/56"
	gw1, gw2 := strings.Split(addrs[0], ":")[0], strings.Split(addrs[1], ":")[0]
	if got := dig(t, r.addr, "vpn.example.test", "A", "+short", ecs); !strings.HasPrefix(got, gw1+"\n") {
		t.Fatalf("before reports: %q, want CoreDNS's own order (gw1 first)", got)
	}

	// One listener each.
	resp, err := http.Get("http://" + reports + "/ogs")
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /ogs on the reports listener: %v %v, want 404", resp.Status, err)
	}
	resp.Body.Close()
	if code, body := postReport(t, admin, "127.0.0.1", tok["h1"], [3]float64{300, 10, 150}); code != http.StatusNotFound || !strings.Contains(body, "no_reports") {
		t.Fatalf("a report on the admin listener: %d %s, want 404 no_reports", code, body)
	}

	for i, src := range honest {
		if code, body := postReport(t, reports, src, tok[fmt.Sprint("h", i+1)], [3]float64{300, 10, 150}); code != http.StatusAccepted {
			t.Fatalf("honest reporter %s: %d %s", src, code, body)
		}
	}
	var last string
	for _, src := range liar {
		code, body := postReport(t, reports, src, tok["liar"], [3]float64{1, 900, 900})
		if last = body; code != http.StatusAccepted {
			t.Fatalf("liar from %s: %d %s", src, code, body)
		}
	}
	if !strings.Contains(last, `"location":"`+base+`::/56"`) || !strings.Contains(last, `"reporters":5,`) || !strings.Contains(last, `"reporter":"liar|`+base+`:17::/64"`) {
		t.Fatalf("the liar's last report: %s, want 5 reporters in %s::/56", last, base)
	}
	if got := dig(t, r.addr, "vpn.example.test", "A", "+short", ecs); !strings.HasPrefix(got, gw2+"\n") {
		t.Fatalf("after the honest reporters and a liar with eight /64s: %q, want gw2 (%s) first", got, gw2)
	}
	if txt := dig(t, r.addr, "_ogs.vpn.example.test", "TXT", "+short", ecs); !strings.Contains(txt, "source reports") || !strings.Contains(txt, "5 reporters") {
		t.Fatalf("TXT %q, want source reports from 5 reporters", txt)
	}

	// A client rotating its address inside one /64 is one source.
	codes := map[int]int{}
	for _, src := range flooder {
		code, _ := postReport(t, reports, src, "not-a-known-token-at-all", [3]float64{1, 1, 1})
		codes[code]++
	}
	if codes[http.StatusTooManyRequests] == 0 || codes[http.StatusTooManyRequests]+codes[http.StatusUnauthorized] != len(flooder) {
		t.Fatalf("fifteen addresses of one /64: %v, want 429 beyond the burst of 10, 401 before", codes)
	}
	if code, body := postReport(t, reports, other, "not-a-known-token-at-all", [3]float64{1, 1, 1}); code != http.StatusUnauthorized {
		t.Fatalf("another /64: %d %s, want 401 (not limited)", code, body)
	}
	if n := metricWith(t, metrics, "coredns_ogs_reports_total", `result="rate_limited_source"`); n != float64(codes[http.StatusTooManyRequests]) {
		t.Fatalf("rate_limited_source counted %v, want %d", n, codes[http.StatusTooManyRequests])
	}
}
