package ogs_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// startWithAdmin starts bin/coredns on corefile and waits for its admin
// listener.
func startWithAdmin(t *testing.T, corefile, adminAddr string) *reloadable {
	t.Helper()
	r := startReloadable(t, corefile)
	r.waitFor(t, "the admin listener", func() bool {
		c, err := net.Dial("tcp", adminAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return r
}

// postFrom sends one client report from source address src.
func postFrom(t *testing.T, url, src string, rtts map[string]int) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
	var gws []string
	for name, ms := range rtts {
		gws = append(gws, fmt.Sprintf(`{"name":"%s.example.test","rtt_ms":%d}`, name, ms))
	}
	body := fmt.Sprintf(`{"probe":"http","time":%q,"gateways":[%s]}`, time.Now().UTC().Format(time.RFC3339Nano), strings.Join(gws, ","))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e2eToken)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("report from %s: %s", src, resp.Status)
	}
}

// The hold through bin/coredns: a location answered from its clients'
// reports keeps its first choice (gw3) when the reports make gw1 closer,
// the rest of the order following them, and the TXT says until when; the
// first choice is released when the re-check finds it dead (its process
// stopped). A reload keeps the hold; after a reload with `hold 0`, a closer
// gateway is first at once.
func TestHoldKeepsFirstChoiceAcrossReports(t *testing.T) {
	addrs, procs := gateways(t, 30*ms, 120*ms, 200*ms, 250*ms)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("branch "+e2eToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminAddr, metricsAddr := e2e.Addr(t), e2e.Addr(t)
	cf := func(extra string) string {
		return corefile(addrs, filepath.Join(dir, "ogs.json"), metricsAddr,
			"admin "+adminAddr+"\n\t\treport_tokens "+tokens+"\n\t\treport_rate 50 50\n\t\trecheck 1s"+extra)
	}
	r := startWithAdmin(t, cf(""), adminAddr)
	url := "http://" + adminAddr + "/ogs/reports"
	report := func(rtts map[string]int) {
		for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			postFrom(t, url, src, rtts)
		}
	}
	order := func() string { return dig(t, r.addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24") }
	txt := func() string { return dig(t, r.addr, "_ogs.vpn.example.test", "TXT", "+short", "+subnet=127.0.0.0/24") }

	report(map[string]int{"gw1": 200, "gw2": 150, "gw3": 10, "gw4": 100})
	if got, want := order(), "127.0.0.13\n127.0.0.14\n127.0.0.12\n127.0.0.11\n"; got != want {
		t.Fatalf("first reports: %q, want %q", got, want)
	}
	// A closer gateway appears: gw3 stays first, the rest as reported.
	report(map[string]int{"gw1": 5, "gw2": 150, "gw3": 10, "gw4": 100})
	if got, want := order(), "127.0.0.13\n127.0.0.11\n127.0.0.14\n127.0.0.12\n"; got != want {
		t.Fatalf("gw1 closer: %q, want gw3 held first then the reported order %q", got, want)
	}
	if s := txt(); !strings.Contains(s, "First choice 'gw3.example.test' held until") {
		t.Fatalf("TXT does not say the hold: %s", s)
	}
	// A reload keeps the hold.
	r.reload(t, "", true)
	if got := order(); !strings.HasPrefix(got, "127.0.0.13\n") {
		t.Fatalf("after a reload: %q, want gw3 still held first", got)
	}
	// gw3 fails the re-check: released, gw1 first.
	procs[2].Kill()
	r.waitFor(t, "gw1 first once gw3 fails the re-check", func() bool { return strings.HasPrefix(order(), "127.0.0.11\n") })

	// Hold off: the closest reported gateway is first at once.
	r.reload(t, cf("\n\t\thold 0"), true)
	report(map[string]int{"gw1": 50, "gw2": 150, "gw3": 10, "gw4": 2})
	if got := order(); !strings.HasPrefix(got, "127.0.0.14\n") {
		t.Fatalf("hold 0: %q, want gw4 first", got)
	}
	if s := txt(); strings.Contains(s, "held until") {
		t.Fatalf("hold 0: TXT still says a hold: %s", s)
	}
}
