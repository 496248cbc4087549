package ogs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

const e2eToken = "e2e-reporter-token-0123456789"

// Client reports through bin/coredns and bin/ogs-report. CoreDNS's own
// probes find gw1 nearest (30 ms; gw2 120, gw3 200, gw4 250). Three
// reporters of one client network (127.0.0.2, .3, .4: 127.0.0.0/24) see
// the gateways from there: each reporter probes its own copies of the
// gateways (same names, other delays), where gw2 is nearest. Queries for
// 127.0.0.0/24 then get gw2 first, with its backup gw4 second (the plugin's
// rule), and "source reports" in the TXT; another network (ECS 10.9.0.0/24)
// still gets CoreDNS's own order. A bad token, an oversized body and an
// unknown gateway are refused with 401, 413 and 400 and their reason.
func TestReportsOrderTheReportersNetwork(t *testing.T) {
	addrs, _ := gateways(t, 30*ms, 120*ms, 200*ms, 250*ms)
	// The gateways as the client network sees them.
	seen := map[string]time.Duration{"gw1": 200 * ms, "gw2": 10 * ms, "gw3": 150 * ms, "gw4": 100 * ms}
	var gwFlags []string
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("gw%d", i)
		addr := fmt.Sprintf("127.0.0.2%d:%d", i, e2e.FreePort(t))
		p := e2e.Start(t, "client-view-"+name, e2e.Bin(t, "testpeer"), nil, "-listen", addr, "-name", name, "-delay", seen[name].String())
		p.WaitTCP(t, addr)
		gwFlags = append(gwFlags, "-gateway", name+".example.test="+addr)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("branch-office "+e2eToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(e2eToken+"\n"), 0o600)
	badTokenFile := filepath.Join(dir, "bad-token")
	os.WriteFile(badTokenFile, []byte("not-a-known-token-at-all\n"), 0o600)
	adminAddr, metricsAddr := e2e.Addr(t), e2e.Addr(t)
	cf := func(extra string) string {
		return corefile(addrs, filepath.Join(dir, "ogs.json"), metricsAddr,
			"admin "+adminAddr+"\n\t\treport_tokens "+tokens+"\n\t\treport_max_body 1024\n\t\treport_rate 50 50"+extra)
	}
	r := startWithAdmin(t, cf(""), adminAddr)
	d := struct{ Addr string }{r.addr}
	url := "http://" + adminAddr + "/ogs/reports"

	own := "127.0.0.11\n127.0.0.12\n127.0.0.13\n127.0.0.14\n"
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24"); got != own {
		t.Fatalf("before reports: %q, want CoreDNS's own order %q", got, own)
	}

	reporter := func(args ...string) (int, string) {
		code, out, errs := runReporter(t, append([]string{"-url", url, "-probe", "http"}, args...)...)
		return code, out + errs
	}
	// Dry run: the report printed, nothing sent.
	if code, out := reporter(append([]string{"-n"}, gwFlags...)...); code != 0 || !strings.Contains(out, `"name": "gw2.example.test"`) {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	for i, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		if code, out := reporter(append([]string{"-token-file", tokenFile, "-source", src}, gwFlags...)...); code != 0 {
			t.Fatalf("reporter %d from %s: exit %d\n%s", i, src, code, out)
		}
		if i == 1 { // two reporters are not enough (min_reporters 3)
			if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24"); got != own {
				t.Fatalf("after two reporters: %q, want CoreDNS's own order", got)
			}
		}
	}
	reported := "127.0.0.12\n127.0.0.14\n127.0.0.13\n127.0.0.11\n" // gw2, its backup gw4, gw3, gw1
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24"); got != reported {
		t.Fatalf("after three reporters: %q, want %q", got, reported)
	}
	txt := dig(t, d.Addr, "_ogs.vpn.example.test", "TXT", "+short", "+subnet=127.0.0.0/24")
	if !strings.Contains(txt, "source reports") || !strings.Contains(txt, "3 reporters") {
		t.Fatalf("TXT: %s", txt)
	}
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=10.9.0.0/24"); got != own {
		t.Fatalf("another network: %q, want CoreDNS's own order %q", got, own)
	}

	// Refusals, through the reporter and raw.
	if code, out := reporter(append([]string{"-token-file", badTokenFile, "-source", "127.0.0.5"}, gwFlags...)...); code != 3 || !strings.Contains(out, "401 unauthorized") {
		t.Fatalf("bad token: exit %d\n%s", code, out)
	}
	unknown := append([]string{"-token-file", tokenFile, "-source", "127.0.0.5"}, gwFlags...)
	unknown = append(unknown, "-gateway", "gw9.example.test="+strings.TrimPrefix(gwFlags[1], "gw1.example.test="))
	if code, out := reporter(unknown...); code != 3 || !strings.Contains(out, "400 unknown_gateway") || !strings.Contains(out, `"gw9.example.test" is not configured`) {
		t.Fatalf("unknown gateway: exit %d\n%s", code, out)
	}
	postRaw := func(token, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := postRaw("wrong", `{}`); code != 401 || !strings.Contains(body, `"error":"unauthorized"`) {
		t.Fatalf("bad token: %d %s", code, body)
	}
	if code, body := postRaw(e2eToken, strings.Repeat(" ", 2048)+"{}"); code != 413 || !strings.Contains(body, `"error":"too_large"`) {
		t.Fatalf("oversized: %d %s", code, body)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	if code, body := postRaw(e2eToken, `{"probe":"http","time":"`+now+`","gateways":[{"name":"gw9.example.test","rtt_ms":1}]}`); code != 400 || !strings.Contains(body, `"error":"unknown_gateway"`) {
		t.Fatalf("unknown gateway: %d %s", code, body)
	}
	for result, want := range map[string]float64{"accepted": 3, "unauthorized": 2, "too_large": 1, "unknown_gateway": 2} {
		if got := metric(t, metricsAddr, `coredns_ogs_reports_total{result="`+result+`"}`); got != want {
			t.Errorf("reports_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	// The admin view: the location, its reporters and order; no token.
	resp, err := http.Get("http://" + adminAddr + "/ogs")
	if err != nil {
		t.Fatal(err)
	}
	view, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`"reports":{`, `"location":"127.0.0.0/24","reporters":3`, `"source":"reports","order":["gw2.example.test","gw4.example.test","gw3.example.test","gw1.example.test"]`, `"tokens":1`, `"min_reporters":3`, `"window_seconds":14400`} {
		if !strings.Contains(string(view), want) {
			t.Errorf("admin view lacks %s:\n%s", want, view)
		}
	}
	if strings.Contains(string(view), e2eToken) {
		t.Error("admin view shows a token")
	}
	// Nothing refused changed the reported order.
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24"); got != reported {
		t.Fatalf("after the refusals: %q", got)
	}

	// A reload (SIGUSR1, with another report_window) keeps the reports.
	r.reload(t, cf("\n\t\treport_window 2h"), true)
	if got := dig(t, d.Addr, "vpn.example.test", "A", "+short", "+subnet=127.0.0.0/24"); got != reported {
		t.Fatalf("after a reload: %q, want the reported order %q", got, reported)
	}
	// The tokens file is re-read on change: the revoked token gets 401.
	time.Sleep(1100 * time.Millisecond) // a new modification time (the file is looked at once a second)
	if err := os.WriteFile(tokens, []byte("other-office other-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "the revoked token refused", func() bool {
		code, _ := postRaw(e2eToken, `{}`)
		return code == 401
	})
	if code, body := postRaw("other-token-0123456789abcdef", `{}`); code != 400 || !strings.Contains(body, `"error":"malformed"`) {
		t.Fatalf("the new token: %d %s", code, body)
	}
}

// The reporter reads the gateways from the served name's SRV records (the
// block's `srv`: the target is the gateway's name, as reports must name
// it) and each target's address from the same server (a hosts block for
// example.test). Its dry run measures all four, nearest lowest; its report
// is accepted, so the names it found are the server's. A name without SRV
// records is a usage error (exit 1), and -name with -gateway is refused.
func TestReporterReadsGatewaysFromSRV(t *testing.T) {
	addrs, _ := gateways(t, 30*ms, 120*ms, 200*ms, 250*ms)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokens, []byte("office "+e2eToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(tokenFile, []byte(e2eToken+"\n"), 0o600)
	adminAddr := e2e.Addr(t)
	var hosts strings.Builder
	for i, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		fmt.Fprintf(&hosts, "\t\t%s gw%d.example.test\n", host, i+1)
	}
	cf := corefile(addrs, filepath.Join(dir, "ogs.json"), e2e.Addr(t),
		"srv\n\t\tadmin "+adminAddr+"\n\t\treport_tokens "+tokens) +
		"example.test {\n\tbind 127.0.0.1\n\thosts {\n" + hosts.String() + "\t}\n}\n"
	r := startReloadable(t, cf)
	r.waitFor(t, "the admin listener", func() bool {
		c, err := net.Dial("tcp", adminAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	reporter := func(args ...string) (int, string, string) {
		return runReporter(t, append([]string{"-url", "http://" + adminAddr + "/ogs/reports",
			"-probe", "http", "-dns", r.addr, "-token-file", tokenFile}, args...)...)
	}

	code, out, errs := reporter("-n", "-name", "vpn.example.test")
	var rep struct {
		Gateways []struct {
			Name  string   `json:"name"`
			RTTMs *float64 `json:"rtt_ms"`
		} `json:"gateways"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("dry run with -name: exit %d\n%s%s", code, out, errs)
	}
	rtt := map[string]float64{}
	for _, g := range rep.Gateways {
		if g.RTTMs == nil {
			t.Fatalf("%s not measured:\n%s", g.Name, out)
		}
		rtt[g.Name] = *g.RTTMs
	}
	if len(rtt) != 4 || !(rtt["gw1.example.test"] < rtt["gw2.example.test"] && rtt["gw2.example.test"] < rtt["gw3.example.test"] &&
		rtt["gw3.example.test"] < rtt["gw4.example.test"]) {
		t.Fatalf("gateways from SRV: %v, want gw1..gw4.example.test, nearest lowest", rtt)
	}
	if code, out, errs := reporter("-name", "vpn.example.test", "-source", "127.0.0.2"); code != 0 {
		t.Fatalf("report with -name: exit %d, want 0 (accepted)\n%s%s", code, out, errs)
	}
	if code, _, errs := reporter("-n", "-name", "gw1.example.test"); code != 1 || !strings.Contains(errs, "SRV of gw1.example.test") {
		t.Fatalf("a name without SRV records: exit %d, want 1 naming the lookup\n%s", code, errs)
	}
	if code, _, errs := reporter("-n", "-name", "vpn.example.test", "-gateway", "gw1.example.test="+addrs[0]); code != 1 {
		t.Fatalf("-name with -gateway: exit %d, want 1\n%s", code, errs)
	}
}

// runReporter runs bin/ogs-report with args and returns its exit code,
// standard output and standard error.
func runReporter(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(e2e.Bin(t, "ogs-report"), args...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errs.String()
}
