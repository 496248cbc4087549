package e2e_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// `make run`'s script starts the demo, which answers over HTTP, layer 4 and
// DNS, and Ctrl-C (SIGINT to its process group) stops everything. The demo
// listens on fixed ports (the ones its banner names), so the test runs in a
// network namespace of its own, where a Caddy or a `make run` on the machine
// cannot collide with it.
func TestDemoStartsAndStopsOnInterrupt(t *testing.T) {
	if !e2e.InNamespace(t) {
		return
	}
	root := e2e.Root(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "demo.sh"))
	cmd.Dir = root
	dnsPort := e2e.FreePort(t)
	logDir := t.TempDir()
	cmd.Env = append(cmd.Environ(),
		"BIN_DIR="+filepath.Dir(e2e.Bin(t, "caddy")),
		fmt.Sprintf("DEMO_DNS_PORT=%d", dnsPort),
		"DEMO_LOG_DIR="+logDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ready := make(chan struct{})
	var output strings.Builder // written only by the reader below until done
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			output.WriteString(sc.Text() + "\n")
			if sc.Text() == "demo ready" {
				close(ready)
			}
		}
		done <- cmd.Wait()
	}()
	// As root the demo makes namespaces esdemo<pid>-*; a demo killed here
	// cannot remove them (this runs after the kill below).
	t.Cleanup(func() {
		out, _ := exec.Command("ip", "netns", "list").Output()
		for _, line := range strings.Split(string(out), "\n") {
			if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, fmt.Sprintf("esdemo%d-", cmd.Process.Pid)) {
				exec.Command("ip", "netns", "del", name).Run()
			}
		}
	})
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("demo ended (%v) before it was ready:\n%s\n%s", err, output.String(), stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("demo not ready in 60 s:\n%s", stderr.String())
	}

	// The servers' logs go to files, not before the banner; the banner names
	// the dashboard and the log files.
	banner := output.String()
	if strings.Contains(banner, `"level":`) || !strings.Contains(banner, "Dashboard: http://127.0.0.1:8488/") ||
		!strings.Contains(banner, filepath.Join(logDir, "<server>.log")) || !strings.Contains(banner, "caddy.log") {
		t.Errorf("banner:\n%s", banner)
	}
	if b, err := os.ReadFile(filepath.Join(logDir, "caddy.log")); err != nil || !strings.Contains(string(b), `"level":`) {
		t.Errorf("caddy.log: %v, %.200q", err, b)
	}

	// Wait for the first probe rounds, then: publishers 1 and 2 share the
	// [0,32) bucket, publisher 3 (40 ms segment) is never picked, and a
	// user sticks to one publisher.
	waitMeasured(t, "demo-http", 3)
	// The layer4 policy's first probe round may run before the publishers
	// (sites of the same Caddy) listen; wait for a round that sees them.
	waitMeasured(t, "demo-l4", 3)
	seen := map[string]int{}
	for i := range 40 {
		h := demoGet(t, fmt.Sprint("user-", i))
		seen[h.Get("X-Publisher")]++
		if h.Get("X-Latency-Bucket") != "[0,32)" {
			t.Fatalf("bucket %q", h.Get("X-Latency-Bucket"))
		}
	}
	if seen["127.0.0.1:8483"] != 0 || seen["127.0.0.1:8481"] == 0 || seen["127.0.0.1:8482"] == 0 {
		t.Fatalf("demo picks %v: want publishers 1 and 2, never 3", seen)
	}
	alice := demoGet(t, "alice").Get("X-Publisher")
	for range 10 {
		if h := demoGet(t, "alice"); h.Get("X-Publisher") != alice || h.Get("X-Publisher-Decision") != "sticky" {
			t.Fatalf("alice moved from %s: %v", alice, h)
		}
	}

	conn, err := net.DialTimeout("tcp", "127.0.0.1:8490", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(conn, "GET /l4 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.Contains(string(body), "answered GET /l4") {
		t.Fatalf("layer4 proxy answered %q", body)
	}

	out, err := exec.Command("dig", "@127.0.0.1", "-p", fmt.Sprint(dnsPort), "www.demo.edgesteer.test", "A", "+short", "+tries=1", "+time=2").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "127.0.0.1" {
		t.Fatalf("dig: %v %q", err, out)
	}

	// peer_rate_limit: a burst of 10 from one peer gets 200s, then 429s.
	codes := map[int]int{}
	for range 10 {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:8485/", nil)
		req.Header.Set("X-Peer", "pgw1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200] == 0 || codes[429] == 0 || codes[200] > 4 {
		t.Fatalf("demo rate limit: %v, want at most 4 admitted then 429s", codes)
	}

	// ogs: the three demo gateways, all answering, best first by their
	// simulated distances (gw2 5 ms, gw3 20 ms, gw1 40 ms), and the
	// selection results.
	out, err = exec.Command("dig", "@127.0.0.1", "-p", fmt.Sprint(dnsPort), "vpn.demo.edgesteer.test", "A", "+short", "+tries=1", "+time=5").CombinedOutput()
	if got := strings.Fields(string(out)); err != nil || len(got) != 3 || got[0] != "127.0.0.22" || got[2] != "127.0.0.21" {
		t.Fatalf("dig vpn.demo.edgesteer.test: %v %q, want 127.0.0.22 (5 ms) first and 127.0.0.21 (40 ms) last", err, out)
	}
	out, _ = exec.Command("dig", "@127.0.0.1", "-p", fmt.Sprint(dnsPort), "_ogs.vpn.demo.edgesteer.test", "TXT", "+short", "+tries=1", "+time=5").CombinedOutput()
	if !strings.Contains(string(out), "as the optimal server") || strings.Contains(string(out), "RTT(ms) -") {
		t.Fatalf("selection results: %q", out)
	}

	checkDemoDiameter(t)
	checkDemoNtier(t)
	tierNS := checkDemoTransparent(t, banner, cmd.Process.Pid)
	checkDemoLDAP(t)
	checkDemoDashboard(t)

	// Ctrl-C in a terminal signals the whole foreground process group.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo exited with %v:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop within 30 s of SIGINT")
	}
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); tierNS != "" && strings.Contains(string(out), tierNS) {
		t.Errorf("the demo's namespaces stay after it stopped:\n%s", out)
	}
	for _, addr := range []string{"127.0.0.1:8480", "127.0.0.1:8490", fmt.Sprintf("127.0.0.1:%d", dnsPort),
		"127.0.0.2:8600", "127.0.0.5:6081", "127.0.0.1:3389", "127.0.0.1:3891", "127.0.0.1:8488"} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the demo stopped", addr)
		}
	}
}

// checkDemoDiameter: the demo's Diameter agent has both PCRFs OKAY, and
// its pGW's 50 requests/s against the PCRF group's 40/s are forwarded and,
// past the limit, refused.
func checkDemoDiameter(t *testing.T) {
	t.Helper()
	var agents []struct {
		Name   string
		Peers  []struct{ Host, State string }
		Groups []struct {
			Name              string
			Admitted, Refused int64
		}
	}
	var why string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := http.Get("http://localhost:2019/diameter_agent/")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&agents)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		why = fmt.Sprintf("%+v", agents)
		if len(agents) != 1 || agents[0].Name != "dra" || len(agents[0].Peers) != 2 || len(agents[0].Groups) != 1 {
			continue
		}
		a := agents[0]
		if a.Peers[0].State == "OKAY" && a.Peers[1].State == "OKAY" && a.Groups[0].Admitted > 0 && a.Groups[0].Refused > 0 {
			return
		}
	}
	t.Fatalf("demo Diameter agent after 30 s: %s, want both PCRFs OKAY and the pcrf group with admitted and refused requests", why)
}

func demoGet(t *testing.T, user string) http.Header {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://127.0.0.1:8480/hello", nil)
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "answered GET /hello") {
		t.Fatalf("front answered %q", body)
	}
	return resp.Header
}

// waitMeasured polls the demo's admin API until policy has n measured
// publishers.
func waitMeasured(t *testing.T, policy string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var views []struct {
			Name       string
			Publishers []struct{ Measured bool }
		}
		if resp, err := http.Get("http://localhost:2019/latency_bucket/"); err == nil {
			json.NewDecoder(resp.Body).Decode(&views)
			resp.Body.Close()
		}
		for _, v := range views {
			m := 0
			for _, p := range v.Publishers {
				if p.Measured {
					m++
				}
			}
			if v.Name == policy && m == n {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("policy %s never had %d measured publishers", policy, n)
}

// checkDemoNtier runs the demo's N-tier flows from client address
// 127.0.0.10: a miss then a hit through varnish, a bypass whose Client-IP
// forgery is replaced, and routing by port alone.
func checkDemoNtier(t *testing.T) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.10")}}).DialContext,
		DisableKeepAlives: true,
	}}
	get := func(path string, header ...string) (http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://127.0.0.2:8600"+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.Header, string(body)
	}
	h1, body := get("/img/demo.png")
	h2, _ := get("/img/demo.png")
	if len(strings.Fields(h1.Get("X-Varnish"))) != 1 || len(strings.Fields(h2.Get("X-Varnish"))) != 2 {
		t.Fatalf("want a miss then a hit: X-Varnish %q, %q", h1.Get("X-Varnish"), h2.Get("X-Varnish"))
	}
	if !strings.Contains(body, "Client-IP=127.0.0.10 ") || !strings.HasSuffix(h2.Get("X-Cache-Path"), " cache") {
		t.Fatalf("miss: %q, X-Cache-Path %q", body, h2.Get("X-Cache-Path"))
	}
	_, body = get("/api/demo", "Client-IP", "6.6.6.6")
	if !strings.HasPrefix(body, "origin: GET /api/demo Client-IP=127.0.0.10 X-Forwarded-For=127.0.0.10 from 127.0.0.1:") {
		t.Fatalf("bypass: %q", body)
	}
	for node, first := range map[string]int{"l2a": 3000, "l2b": 45000} {
		// A source port in the node's range; one in use is skipped.
		var resp *http.Response
		var err error
		port := first
		for ; port < first+50; port++ {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: port}}
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
			if resp, err = c.Get("http://127.0.0.2:8700/"); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%s port %d", node, port); string(b) != want {
			t.Fatalf("flow from port %d reached %q, want %q", port, b, want)
		}
	}
}

// checkDemoLDAP binds through the demo's tenant router with ldapsearch.
func checkDemoLDAP(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ldapsearch", "-x", "-H", "ldap://127.0.0.1:3389", "-D", "uid=alice,o=acme,dc=example",
		"-w", "pw", "-b", "cn=marker,dc=example", "description").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "description: node-") {
		t.Fatalf("ldapsearch through the demo router: %v\n%s", err, out)
	}
	resp, err := http.Get("http://localhost:2023/tenant_route/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"membership":"static"`) || !strings.Contains(string(b), "127.0.0.1:3893") {
		t.Fatalf("tenant_route admin view: %s", b)
	}
}

// checkDemoDashboard reads the demo dashboard's state: this Caddy's
// publishers and limiter, the other demo Caddys (N-tier nodes, LDAP router)
// as replicas with their views, the background load moving a series, and
// the ogs plugin's JSON view of CoreDNS.
func checkDemoDashboard(t *testing.T) {
	t.Helper()
	type remote struct {
		URL       string
		Reachable bool
		Error     string
		Body      map[string]json.RawMessage
	}
	var st struct {
		Modules  map[string]json.RawMessage
		OGS      []remote
		Replicas []remote
		Series   struct {
			TimesMS []int64 `json:"times_ms"`
			Values  map[string][]*float64
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:8488/api/state")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		reachable := 0
		for _, r := range st.Replicas {
			if r.Reachable {
				reachable++
			}
		}
		// N-tier requests by the background load, as a rate.
		moving := false
		for k, v := range st.Series.Values {
			if strings.Contains(k, "requests_total") {
				for _, x := range v {
					moving = moving || (x != nil && *x > 0)
				}
			}
		}
		if len(st.Series.TimesMS) >= 3 && reachable == 4 && moving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dashboard state after 60 s: %d samples, replicas %+v, moving %v", len(st.Series.TimesMS), st.Replicas, moving)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(string(st.Modules["latency_bucket"]), "demo-http") || !strings.Contains(string(st.Modules["peer_rate_limit"]), "gx-ccr-i") {
		t.Errorf("dashboard modules: %s", st.Modules)
	}
	views := ""
	for _, r := range st.Replicas {
		views += string(r.Body["cache_redirect"]) + string(r.Body["port_range"]) + string(r.Body["tenant_route"])
	}
	for _, want := range []string{`"node":"l2a"`, `"node":"l2b"`, `"ports":"1024-33279"`, `"name":"ldap"`} {
		if !strings.Contains(views, want) {
			t.Errorf("replica views lack %s: %s", want, views)
		}
	}
	// The ogs plugin's JSON view (demo.Corefile's admin address), fetched
	// by Caddy: the demo zone and its three gateways.
	if len(st.OGS) != 1 || !st.OGS[0].Reachable {
		t.Errorf("ogs: %+v, want the one URL answering", st.OGS)
	} else {
		servers := string(st.OGS[0].Body["servers"])
		for _, want := range []string{"vpn.demo.edgesteer.test", "gw1.demo.edgesteer.test", "gw2.demo.edgesteer.test", "gw3.demo.edgesteer.test"} {
			if !strings.Contains(servers, want) {
				t.Errorf("ogs view lacks %s: %s", want, servers)
			}
		}
	}
	resp, err := http.Get("http://127.0.0.1:8488/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "assets/app.js") {
		t.Errorf("dashboard page: %s %.200q", resp.Status, b)
	}
}

// checkDemoTransparent: as root the demo runs the transparent N-tier in
// namespaces esdemo<its pid>-*: four client addresses fetching
// http://203.0.113.80/ are answered by a lower node that sees the address
// asked for and the client's own, each address always by the same node.
// It returns the namespaces' prefix.
func checkDemoTransparent(t *testing.T, banner string, pid int) string {
	t.Helper()
	ns := fmt.Sprintf("esdemo%d", pid)
	if !strings.Contains(banner, "namespaces "+ns+"-*") {
		t.Errorf("the banner (as root) does not show the transparent N-tier in %s-*:\n%s", ns, banner)
		return ns
	}
	for _, a := range []string{"10.78.0.100", "10.78.0.101", "10.78.0.102", "10.78.0.103"} {
		first := ""
		for range 3 {
			out, err := exec.Command("ip", "netns", "exec", ns+"-client", "curl", "-s", "-m", "3", "--interface", a, "http://203.0.113.80/").CombinedOutput()
			node, rest, _ := strings.Cut(string(out), " answers: ")
			if err != nil || rest != "you asked 203.0.113.80:80, you are "+a || (node != "l2a" && node != "l2b") || (first != "" && node != first) {
				t.Errorf("client %s through the transparent tier: %v %q (first answered by %q)", a, err, out, first)
			}
			first = node
		}
	}
	return ns
}
