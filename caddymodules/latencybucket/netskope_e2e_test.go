package latencybucket_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

const ms = time.Millisecond

// publishers starts one testpeer process per delay: publisher-1… answering
// GET /probe after its delay.
func publishers(t *testing.T, delays ...time.Duration) ([]string, []*e2e.Proc) {
	addrs := make([]string, len(delays))
	procs := make([]*e2e.Proc, len(delays))
	for i, d := range delays {
		addrs[i] = e2e.Addr(t)
		procs[i] = e2e.StartPeer(t, fmt.Sprintf("publisher-%d", i+1), addrs[i], d)
	}
	return addrs, procs
}

// example loads a Caddyfile example with its fixed addresses replaced.
func example(t *testing.T, name string, oldnew ...string) string {
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer(oldnew...).Replace(string(data))
}

// adminView polls the admin API until policy lists at least n publishers
// measured over two rounds or more.
func adminView(t *testing.T, c *e2e.Caddy, policy string, n int) latencybucket.PolicyView {
	t.Helper()
	var last []latencybucket.PolicyView
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + c.Admin + "/latency_bucket/")
		if err == nil {
			last = nil
			json.NewDecoder(resp.Body).Decode(&last)
			resp.Body.Close()
			for _, v := range last {
				measured := 0
				for _, p := range v.Publishers {
					if p.Measured && p.Rounds >= 2 {
						measured++
					}
				}
				if v.Name == policy && measured >= n {
					return v
				}
			}
		}
		time.Sleep(100 * ms)
	}
	t.Fatalf("policy %s never had %d measured publishers: %+v", policy, n, last)
	return latencybucket.PolicyView{}
}

type answer struct {
	peer, bucket, decision, latency, generation string
	err                                         error
}

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(url, host, user string) answer { return getWith(client, url, host, user) }

func getWith(client *http.Client, url, host, user string) answer {
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	if user != "" {
		req.Header.Set("X-User", user)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return answer{err: fmt.Errorf("status %s", resp.Status)}
	}
	return answer{
		peer: resp.Header.Get("X-Peer"), bucket: resp.Header.Get("X-Latency-Bucket"),
		decision: resp.Header.Get("X-Publisher-Decision"), latency: resp.Header.Get("X-Latency-Ms"),
		generation: resp.Header.Get("X-Generation"),
	}
}

// Netskope's table through bin/caddy: publishers at 10, 12, 42, 42 ms; only
// 1 and 2 are chosen; each user sticks; the admin view shows the details.
func TestHTTPNetskopeTableStickinessAndAdminView(t *testing.T) {
	pubs, _ := publishers(t, 10*ms, 12*ms, 42*ms, 42*ms)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", example(t, "publisher-selection.Caddyfile",
		"127.0.0.1:8080", front, "127.0.0.1:9001", pubs[0], "127.0.0.1:9002", pubs[1],
		"127.0.0.1:9003", pubs[2], "127.0.0.1:9004", pubs[3], "probe_interval 2s", "probe_interval 200ms"))
	c.WaitTCP(t, front)
	view := adminView(t, c, "apps", 4)

	for i, p := range view.Publishers {
		want := "[0,32)"
		if i >= 2 {
			want = "[32,64)"
		}
		if p.Bucket != want || !p.Active {
			t.Errorf("publisher %s: bucket %s active %v, want %s active", p.Address, p.Bucket, p.Active, want)
		}
		if floor := []float64{10, 12, 42, 42}[i]; p.LatencyMS < floor {
			t.Errorf("publisher %s: latency %.1f ms below its real %v ms delay", p.Address, p.LatencyMS, floor)
		}
	}

	seen := map[string]int{}
	for i := range 200 {
		a := get("http://"+front+"/", "", fmt.Sprint("user-", i))
		if a.err != nil {
			t.Fatal(a.err)
		}
		seen[a.peer]++
		if a.bucket != "[0,32)" || a.decision != "new" || a.latency == "" {
			t.Fatalf("placeholders: %+v", a)
		}
	}
	if seen["publisher-3"]+seen["publisher-4"] != 0 || seen["publisher-1"] < 50 || seen["publisher-2"] < 50 {
		t.Fatalf("choices %v: want only publishers 1 and 2, both", seen)
	}

	first := get("http://"+front+"/", "", "alice")
	for i := range 100 {
		a := get("http://"+front+"/", "", "alice")
		if a.err != nil || a.peer != first.peer || a.decision != "sticky" {
			t.Fatalf("request %d for alice: %+v, first went to %s", i, a, first.peer)
		}
	}

	checkAccessLog(t, c.Logs, pubs)

	view = adminView(t, c, "apps", 4)
	if view.StickyEntries != 201 || !view.Sticky || view.BucketWidthMS != 32 {
		t.Fatalf("admin view: sticky %v entries %d width %v", view.Sticky, view.StickyEntries, view.BucketWidthMS)
	}

	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`caddy_edgesteer_latency_bucket_selections_total{bucket="[0,32)",decision="sticky",policy="apps",publisher="`,
		`caddy_edgesteer_latency_bucket_probe_rtt_seconds_bucket{policy="apps",publisher="` + pubs[2] + `"`,
		`caddy_edgesteer_latency_bucket_publisher_bucket{policy="apps",publisher="` + pubs[3] + `"} 1`,
		`caddy_edgesteer_latency_bucket_sticky_entries{policy="apps"} 201`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// Netskope's FAQ through bin/caddy: apps #1 Jira {1,2}, #2 SQL Server
// {1,3,4}, #3 Web Server {1,2,3,4}; publisher 1 in [32,64), 2, 3, 4 in
// [0,32). User A sticks per app, user B is independent, and when A's
// publisher is killed mid-traffic, A moves with no failed request and
// sticks again.
func TestHTTPNetskopeFAQFailover(t *testing.T) {
	pubs, procs := publishers(t, 40*ms, 12*ms, 5*ms, 20*ms)
	front := e2e.Addr(t)
	_, port, _ := net.SplitHostPort(front)
	site := func(host, policy string, idx ...int) string {
		var ups []string
		for _, i := range idx {
			ups = append(ups, pubs[i-1])
		}
		return fmt.Sprintf(`http://%s:%s {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy latency_bucket {
			name %s
			probe http /probe
			probe_interval 200ms
			probe_timeout 500ms
			sticky_user {http.request.header.X-User}
		}
		lb_retries 3
		fail_duration 30s
		header_down X-Publisher-Decision {http.reverse_proxy.latency_bucket.decision}
	}
}
`, host, port, strings.Join(ups, " "), policy)
	}
	c := e2e.StartCaddy(t, "caddyfile", site("jira.test", "jira", 1, 2)+site("sql.test", "sql", 1, 3, 4)+site("web.test", "web", 1, 2, 3, 4))
	c.WaitTCP(t, front)
	adminView(t, c, "sql", 3)
	adminView(t, c, "web", 4)
	url := "http://" + front + "/"

	a := get(url, "sql.test", "userA")
	if a.err != nil || (a.peer != "publisher-3" && a.peer != "publisher-4") {
		t.Fatalf("user A on app #2 got %+v, want publisher 3 or 4", a)
	}
	for i := range 100 {
		if b := get(url, "sql.test", "userA"); b.peer != a.peer || b.decision != "sticky" {
			t.Fatalf("request %d: user A moved to %+v", i, b)
		}
	}
	web := map[string]int{}
	for i := range 150 {
		web[get(url, "web.test", fmt.Sprint("web-user-", i)).peer]++
	}
	if web["publisher-1"] != 0 || web["publisher-2"] == 0 || web["publisher-3"] == 0 || web["publisher-4"] == 0 {
		t.Fatalf("app #3 picks %v: want 2, 3 and 4, never 1", web)
	}
	sql := map[string]int{}
	for i := range 150 {
		sql[get(url, "sql.test", fmt.Sprint("userB-", i)).peer]++
	}
	if sql["publisher-1"] != 0 || sql["publisher-3"] < 30 || sql["publisher-4"] < 30 {
		t.Fatalf("app #2 users spread %v: want 3 and 4, independent of user A", sql)
	}
	jira := get(url, "jira.test", "userA")
	if jira.peer != "publisher-2" {
		t.Fatalf("app #1 (Jira) for user A went to %s, want publisher-2 (the only one in [0,32))", jira.peer)
	}

	// Kill user A's publisher while A's requests flow.
	victim := procs[3]
	other := "publisher-3"
	if a.peer == "publisher-3" {
		victim, other = procs[2], "publisher-4"
	}
	failoverUnderLoad(t, victim, 0, func() error { return get(url, "sql.test", "userA").err })
	for i := range 100 {
		if b := get(url, "sql.test", "userA"); b.err != nil || b.peer != other || b.decision != "sticky" {
			t.Fatalf("after failover request %d: %+v, want sticky on %s", i, b, other)
		}
	}
	view := adminView(t, c, "sql", 2)
	for _, p := range view.Publishers {
		if p.Address == pubs[3] && a.peer == "publisher-4" || p.Address == pubs[2] && a.peer == "publisher-3" {
			if p.Active || p.LastError == "" {
				t.Fatalf("killed publisher shown as %+v", p)
			}
		}
	}
}

// layer4: connections from one client IP stick for 100 connections; many
// client IPs (127.0.0.x) only ever reach the lowest bucket.
func TestLayer4NetskopeTableAndStickiness(t *testing.T) {
	pubs, _ := publishers(t, 10*ms, 12*ms, 42*ms, 42*ms)
	front := e2e.Addr(t)
	cfg := example(t, "publisher-selection-l4.Caddyfile",
		"127.0.0.1:8443", front, "127.0.0.1:9001", pubs[0], "127.0.0.1:9002", pubs[1],
		"127.0.0.1:9003", pubs[2], "127.0.0.1:9004", pubs[3], "probe_interval 2s", "probe_interval 200ms")
	// Netskope's table's latencies live in the probe exchange: probe over HTTP.
	cfg = strings.Replace(cfg, "name l4-apps", "name l4-apps\n\t\t\t\t\t\tprobe http /probe", 1)
	c := e2e.StartCaddy(t, "caddyfile", cfg)
	c.WaitTCP(t, front)
	adminView(t, c, "l4-apps", 4)

	dial := func(src string) (string, error) { return dialL4(front, src) }
	first, err := dial("127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if p, err := dial("127.0.0.2"); err != nil || p != first {
			t.Fatalf("connection %d from 127.0.0.2 went to %s (%v), first to %s", i, p, err, first)
		}
	}
	seen := map[string]int{}
	for i := 10; i < 110; i++ {
		p, err := dial(fmt.Sprintf("127.0.0.%d", i))
		if err != nil {
			t.Fatal(err)
		}
		seen[p]++
	}
	if seen["publisher-3"]+seen["publisher-4"] != 0 || seen["publisher-1"] < 20 || seen["publisher-2"] < 20 {
		t.Fatalf("layer4 choices %v: want only publishers 1 and 2, both", seen)
	}
	// 101 clients, plus the harness's readiness connection from 127.0.0.1
	// if it came after the first probe round (picks made before anything
	// is measured are not pinned).
	if v := adminView(t, c, "l4-apps", 4); v.StickyEntries < 101 || v.StickyEntries > 102 || v.Kind != "layer4" {
		t.Fatalf("admin view: %d sticky entries, kind %s", v.StickyEntries, v.Kind)
	}
}

// dialL4 connects to the layer4 front from source IP src, sends an HTTP
// request over the raw connection and returns the answering peer's name.
func dialL4(front, src string) (string, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", front)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "GET /l4 HTTP/1.0\r\nHost: x\r\n\r\n")
	body, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	if i := strings.Index(string(body), "\r\n\r\n"); i >= 0 && len(body) > i+4 {
		return strings.Fields(string(body[i+4:]))[0], nil
	}
	return "", fmt.Errorf("no HTTP answer: %q", body)
}

// layer4 failover: kill the publisher a client IP sticks to while its
// connections flow; the proxy's retries and passive health move it, and it
// sticks again. Only connections in flight at the kill may fail: the one
// open to it (its bytes already went to the dead publisher, and a layer 4
// proxy cannot replay a stream elsewhere) and, since the kernel still
// completes handshakes on the dying process's listening socket until it is
// closed, at most one more dialled in that instant; with one client at a
// time, that is at most 2 (the README says so). Every later one succeeds.
func TestLayer4Failover(t *testing.T) {
	pubs, procs := publishers(t, 5*ms, 8*ms)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			route {
				proxy %s %s {
					lb_policy latency_bucket {
						name l4-failover
						probe http /probe
						probe_interval 200ms
						probe_timeout 500ms
					}
					lb_try_duration 5s
					lb_try_interval 50ms
					fail_duration 30s
				}
			}
		}
	}
}`, front, pubs[0], pubs[1]))
	c.WaitTCP(t, front)
	adminView(t, c, "l4-failover", 2)
	first, err := dialL4(front, "127.0.0.3")
	if err != nil {
		t.Fatal(err)
	}
	victim, other := procs[0], "publisher-2"
	if first == "publisher-2" {
		victim, other = procs[1], "publisher-1"
	}
	failoverUnderLoad(t, victim, 2, func() error {
		_, err := dialL4(front, "127.0.0.3")
		return err
	})
	for i := range 50 {
		if p, err := dialL4(front, "127.0.0.3"); err != nil || p != other {
			t.Fatalf("after failover connection %d went to %s (%v), want %s", i, p, err, other)
		}
	}
}

// Probing follows the config generations that use a state: a reload that
// renames the policy drops the old name's state (the admin view lists only
// the new one, and the old one's publisher sees no more probes); a reload
// that keeps the name but removes an upstream stops probing that upstream
// alone, when no generation uses it any more, while the kept upstream goes
// on with its rounds counted from before.
func TestReloadStopsProbingWhatNoGenerationUses(t *testing.T) {
	pubs, _ := publishers(t, 1*ms, 1*ms)
	front := e2e.Addr(t)
	cfg := func(name string, ups ...string) string {
		return fmt.Sprintf("http://%s {\n\tbind 127.0.0.1\n\treverse_proxy %s {\n\t\tlb_policy latency_bucket {\n\t\t\tname %s\n\t\t\tprobe http /probe\n\t\t\tprobe_interval 100ms\n\t\t}\n\t}\n}\n",
			front, strings.Join(ups, " "), name)
	}
	c := e2e.StartCaddy(t, "caddyfile", cfg("before", pubs[0]))
	adminView(t, c, "before", 1)
	c.Load(t, "caddyfile", cfg("after", pubs...))
	adminView(t, c, "after", 2)
	var views []latencybucket.PolicyView
	c.AdminJSON(t, "/latency_bucket/", &views)
	if len(views) != 1 || views[0].Name != "after" {
		t.Fatalf("after reload the admin view lists %+v", views)
	}
	// The old policy's probe count stands still; the new one's grows.
	probes := func(policy, pub string) float64 {
		v, ok := c.Metric(t, `caddy_edgesteer_latency_bucket_probe_rtt_seconds_count{policy="`+policy+`",publisher="`+pub+`"}`)
		if !ok {
			t.Fatalf("no probe count for %s %s", policy, pub)
		}
		return v
	}
	// grows waits until policy has probed pub n more times.
	grows := func(policy, pub string, n float64) {
		t.Helper()
		before := probes(policy, pub)
		deadline := time.Now().Add(10 * time.Second)
		for probes(policy, pub) < before+n {
			if time.Now().After(deadline) {
				t.Fatalf("%s not probing %s", policy, pub)
			}
			time.Sleep(50 * ms)
		}
	}
	// stands checks that policy's probes of pub stand still while the live
	// policy probes `live` six more times (the condition that shows
	// several intervals have passed, rather than a fixed sleep).
	stands := func(policy, pub, live string) {
		t.Helper()
		before := probes(policy, pub)
		grows("after", live, 6)
		if now := probes(policy, pub); now != before {
			t.Fatalf("%s still probing %s: %v then %v", policy, pub, before, now)
		}
	}
	stands("before", pubs[0], pubs[0])

	// Same name, publisher 2 removed: only its probing stops.
	was := adminView(t, c, "after", 2)
	c.Reload(t, "caddyfile", cfg("after", pubs[0]))
	now := adminView(t, c, "after", 1)
	if len(now.Publishers) != 1 || now.Publishers[0].Address != pubs[0] || now.StateSince != was.StateSince ||
		now.Publishers[0].Rounds < was.Publishers[0].Rounds {
		t.Fatalf("after removing publisher 2: %+v (before: %+v)", now, was)
	}
	stands("after", pubs[1], pubs[0])
}

// failoverUnderLoad sends one request or connection after another with do,
// kills victim 300 ms in, goes on for 1.5 s (several probe rounds), and
// fails the test if more than allowed attempts failed.
func failoverUnderLoad(t *testing.T, victim *e2e.Proc, allowed int64, do func() error) {
	t.Helper()
	var failures, sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			if err := do(); err != nil {
				failures.Add(1)
				t.Logf("attempt failed during failover: %v", err)
			}
		}
	}()
	time.Sleep(300 * ms)
	victim.Kill()
	time.Sleep(1500 * ms)
	close(stop)
	<-done
	if f := failures.Load(); f > allowed {
		t.Fatalf("%d of %d attempts failed during failover, %d allowed", f, sent.Load(), allowed)
	}
}
