package ogs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// nftDrop drops, in the test's own namespace, the TCP packets to addr
// (host:port) that match what ("tcp flags & (syn|ack) == syn" for SYNs only,
// "" for every packet): a gateway that silently drops, not one that
// refuses. The rules go in a table of their own, deleted when the test ends.
func nftDrop(t *testing.T, addr, what string) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	table := "ogstest"
	rules := fmt.Sprintf("table inet %[1]s {\n\tchain out {\n\t\ttype filter hook output priority 0; policy accept;\n\t\tip daddr %[2]s tcp dport %[3]s %[4]s drop\n\t}\n}\n", table, host, port, what)
	path := filepath.Join(t.TempDir(), "drop.nft")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nft", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -f:\n%s\n%v\n%s", rules, err, out)
	}
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", table).Run() })
}

// A gateway whose SYNs are dropped, next to three live ones. Each probe has
// its own timeout, so the silent gateway costs one probe timeout, not the
// run's 7 s deadline: with a 500 ms probe timeout (the tcp probe's default)
// the first answer is the measured order, the silent gateway last, with the
// full TTL, though the query would have waited up to 5 s. With the http
// probe's default timeout (2 s) the run outlasts the default 1.5 s answer
// deadline: the first answer
// comes then, with the gateways heard from so far first and the 5 s
// fallback TTL, and once the run is over the measured order answers with
// the full TTL.
func TestSilentGatewayDoesNotStallAnswers(t *testing.T) {
	if !e2e.InNamespace(t) {
		return
	}
	addrs, _ := gateways(t, 210*ms, 10*ms, 0, 110*ms) // 100 ms apart: a busy machine's probe noise stays inside
	nftDrop(t, addrs[2], "tcp flags & (syn|ack) == syn")
	want := []string{"127.0.0.12", "127.0.0.14", "127.0.0.11", "127.0.0.13"} // gw2, its backup gw4, gw1, silent gw3
	for _, tc := range []struct {
		name, extra string
		firstTTL    uint32
	}{
		{"probe_timeout_500ms", "probe_timeout 500ms\n\t\tanswer_deadline 5s", 30},
		{"defaults", "", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := corefile(addrs, filepath.Join(t.TempDir(), "ogs.json"), e2e.Addr(t), tc.extra)
			d := e2e.StartCoreDNS(t, cf, "other.example.test A")
			ips, ttl := aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, ""))
			if !slices.Equal(ips, want) || ttl != tc.firstTTL {
				t.Fatalf("first answer %v TTL %d, want %v TTL %d", ips, ttl, want, tc.firstTTL)
			}
			for deadline := time.Now().Add(30 * time.Second); ttl != 30; time.Sleep(100 * ms) {
				if time.Now().After(deadline) {
					t.Fatalf("the measured order never answered with the full TTL: %v TTL %d", ips, ttl)
				}
				ips, ttl = aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, ""))
			}
			if !slices.Equal(ips, want) {
				t.Fatalf("measured order %v, want %v", ips, want)
			}
			txt := txtOf(ask(t, d.Addr, "_ogs.vpn.example.test", dns.TypeTXT, ""))
			if !strings.Contains(txt, "gw3.example.test "+addrs[2]+" RTT(ms) - error timeout") {
				t.Fatalf("TXT does not say the silent gateway timed out:\n%s", txt)
			}
		})
	}
}

// A gateway cached as first that later starts dropping packets (no refusal,
// no reset: its probes time out) is moved behind its backup by the
// re-check, within one re-check interval plus one probe timeout, without a
// probe run; when it answers again it is put back.
func TestRecheckMovesDroppingFirstChoice(t *testing.T) {
	if !e2e.InNamespace(t) {
		return
	}
	addrs, _ := gateways(t, 100*ms, 10*ms, 200*ms, 300*ms)
	metricsAddr := e2e.Addr(t)
	d := e2e.StartCoreDNS(t, corefile(addrs, filepath.Join(t.TempDir(), "ogs.json"), metricsAddr, "recheck 1s"), "other.example.test A")
	order := func() []string {
		ips, _ := aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, "10.4.0.0/24"))
		return ips
	}
	want := []string{"127.0.0.12", "127.0.0.14", "127.0.0.11", "127.0.0.13"} // gw2, its backup gw4, gw1, gw3
	// The location's one run, finished and counted: its answer alone does
	// not say so (the run counts itself after its queries are answered),
	// and a count read before that would take the run for a re-check's.
	d.WaitFor(t, "the measured order and its run counted", 30*time.Second, func() error {
		ips, ttl := aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, "10.4.0.0/24"))
		if !slices.Equal(ips, want) || ttl != 30 {
			return fmt.Errorf("order %v ttl %d", ips, ttl)
		}
		if n := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); n != 1 {
			return fmt.Errorf("%v probe runs counted", n)
		}
		return nil
	})
	runs := metric(t, metricsAddr, "coredns_ogs_probe_runs_total")

	nftDrop(t, addrs[1], "")
	dropped := time.Now()
	moved := []string{"127.0.0.14", "127.0.0.11", "127.0.0.13", "127.0.0.12"}
	d.WaitFor(t, "gw2 moved behind its backup", 30*time.Second, func() error {
		if got := order(); !slices.Equal(got, moved) {
			return fmt.Errorf("order %v", got)
		}
		return nil
	})
	t.Logf("moved %v after the drop rule (re-check every 1s, probe timeout 2s)", time.Since(dropped).Round(100*ms))
	txt := txtOf(ask(t, d.Addr, "_ogs.vpn.example.test", dns.TypeTXT, "10.4.0.0/24"))
	if !strings.Contains(txt, "gw2.example.test "+addrs[1]+" RTT(ms) ") || !strings.Contains(txt, "re-check failed timeout") || !strings.Contains(txt, "Results obtained from OGS cache") {
		t.Fatalf("TXT with gw2 dropping packets:\n%s", txt)
	}
	if n := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); n != runs {
		t.Fatalf("%v probe runs during the re-checks", n-runs)
	}

	exec.Command("nft", "delete", "table", "inet", "ogstest").Run()
	d.WaitFor(t, "gw2 back first", 30*time.Second, func() error {
		if got := order(); !slices.Equal(got, want) {
			return fmt.Errorf("order %v", got)
		}
		return nil
	})
}
