package ogs_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Any HTTP answer completes a probe (AnyConnect counts the answer itself,
// CSCtg38672): gw1, nearest but answering 503, is measured and first by
// default; after a reload with probe_check_status it fails its probes and
// gw2 is first, the TXT saying why. Along the way, the troubleshooting
// lines in bin/coredns's log: a gateway's probes starting, the first cache
// hit of a result (once, however many queries), and "Last server".
func TestAnyHTTPAnswerCompletesProbe(t *testing.T) {
	addrs := make([]string, 4)
	for i, d := range []string{"30ms", "120ms", "200ms", "250ms"} {
		addrs[i] = fmt.Sprintf("127.0.0.1%d:%d", i+1, e2e.FreePort(t))
		args := []string{"-listen", addrs[i], "-name", fmt.Sprintf("gw%d", i+1), "-delay", d}
		if i == 0 {
			args = append(args, "-status", "503")
		}
		e2e.Start(t, fmt.Sprintf("gw%d", i+1), e2e.Bin(t, "testpeer"), nil, args...).WaitTCP(t, addrs[i])
	}
	dir := t.TempDir()
	cf := func(extra string) string {
		return corefile(addrs, filepath.Join(dir, "ogs.json"), e2e.Addr(t), extra)
	}
	r := startReloadable(t, cf(""))
	first := func() string {
		return strings.SplitN(dig(t, r.addr, "vpn.example.test", "A", "+short", "+subnet=10.1.0.0/24"), "\n", 2)[0]
	}
	if got := first(); got != "127.0.0.11" {
		t.Fatalf("default: first %s, want gw1 (127.0.0.11): a 503 is an answer", got)
	}
	first()
	first()
	logs := r.logs()
	for _, want := range []string{
		"OGS starting thread named gw1.example.test (" + addrs[0] + ") for location ecs:10.1.0.0/24",
		"OGS starting thread named gw4.example.test (" + addrs[3] + ") for location ecs:10.1.0.0/24",
		"Selected 'gw1.example.test' as the optimal server for location ecs:10.1.0.0/24. Last server: none.",
	} {
		if !strings.Contains(logs, want) {
			t.Fatalf("log lacks %q:\n%s", want, logs)
		}
	}
	hit := "OGS was already performed, previous selection will be used (location ecs:10.1.0.0/24, 'gw1.example.test' first)."
	if n := strings.Count(logs, hit); n != 1 {
		t.Fatalf("%d cache hit lines for two cache hits of one result, want 1:\n%s", n, logs)
	}
	r.reload(t, cf("probe_check_status"), true)
	if got := first(); got != "127.0.0.12" {
		t.Fatalf("probe_check_status: first %s, want gw2 (127.0.0.12)", got)
	}
	txt := dig(t, r.addr, "_ogs.vpn.example.test", "TXT", "+short", "+subnet=10.1.0.0/24")
	if !strings.Contains(txt, "gw1.example.test "+addrs[0]+" RTT(ms) - error") || !strings.Contains(txt, `"Last server: 'gw2.example.test'."`) {
		t.Fatalf("TXT does not show gw1 failed, or gw2 as the last server: %s", txt)
	}
	if logs := r.logs(); !strings.Contains(logs, "Selected 'gw2.example.test' as the optimal server for location ecs:10.1.0.0/24. Last server: 'gw1.example.test'.") {
		t.Fatalf("the re-probe's log lacks gw1 as the last server:\n%s", logs)
	}
}
