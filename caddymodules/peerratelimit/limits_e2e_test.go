package peerratelimit_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// metricServer serves a Prometheus text metric whose value the test sets;
// a negative value makes it answer 503.
func metricServer(t *testing.T) (string, *atomic.Int64) {
	var v atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v.Load() < 0 {
			http.Error(w, "exporter down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "# TYPE db_cpu_percent gauge\ndb_cpu_percent{host=\"db2\"} 5\ndb_cpu_percent{host=\"db1\"} %d\n", v.Load())
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String() + "/metrics", &v
}

// exampleConfig loads rate-limit.Caddyfile with its addresses replaced:
// PCRF peers pcrf1 and pcrf2 and the OCS peer ocs are started here.
func exampleConfig(t *testing.T, front, metrics string, oldnew ...string) string {
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "rate-limit.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for _, name := range []string{"pcrf1", "pcrf2", "ocs"} {
		addr := e2e.Addr(t)
		e2e.StartPeer(t, name, addr, 0)
		peers = append(peers, addr)
	}
	return strings.NewReplacer("127.0.0.1:8081", front, "127.0.0.1:9001", peers[0],
		"127.0.0.1:9002", peers[1], "127.0.0.1:9003", peers[2],
		"http://127.0.0.1:9100/metrics", metrics, "reversal_hold 30s", "reversal_hold 2s",
		"interval 1s", "interval 200ms").Replace(strings.NewReplacer(oldnew...).Replace(string(data)))
}

type outcome struct {
	// elapsed runs from the first request to the last answer: requests in
	// flight at the deadline are decided after it, so bounds on admitted
	// counts use this, not the nominal duration.
	elapsed             time.Duration
	ok, rejected, other atomic.Int64
	retryAfter          atomic.Value
	body                atomic.Value
	status              atomic.Int64 // of the last refusal
	peers               sync.Map     // X-Peer of admitted answers → *atomic.Int64
}

// burst sends POSTs to url as peer from 4 goroutines for d.
func burst(t *testing.T, url, peer string, d time.Duration) *outcome {
	return burstWith(t, url, d, 4, func() string { return peer })
}

func burstWith(t *testing.T, url string, d time.Duration, workers int, peer func() string) *outcome {
	var o outcome
	client := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				req, _ := http.NewRequest("POST", url, nil)
				req.Header.Set("X-Peer", peer())
				resp, err := client.Do(req)
				if err != nil {
					o.other.Add(1)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					o.ok.Add(1)
					n, _ := o.peers.LoadOrStore(resp.Header.Get("X-Peer"), new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				case 429, 503:
					o.rejected.Add(1)
					o.status.Store(int64(resp.StatusCode))
					o.retryAfter.Store(resp.Header.Get("Retry-After"))
					o.body.Store(string(body))
				default:
					o.other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	o.elapsed = time.Since(start)
	return &o
}

// most is what a limit of rate per second with burst can admit in d:
// rate × d + burst, plus one for the admission at the window's start.
func most(rate float64, burst int, d time.Duration) int64 {
	return int64(rate*d.Seconds()) + int64(burst) + 1
}

func adminView(t *testing.T, c *e2e.Caddy) []peerratelimit.HandlerView {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/peer_rate_limit/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v []peerratelimit.HandlerView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func handlerView(v []peerratelimit.HandlerView, name string) peerratelimit.HandlerView {
	for _, h := range v {
		if h.Name == name {
			return h
		}
	}
	return peerratelimit.HandlerView{}
}

func limitOf(v []peerratelimit.HandlerView, profile, name string) peerratelimit.RuleView {
	for _, h := range v {
		for _, p := range h.Profiles {
			for _, l := range p.Limits {
				if p.Name == profile && l.Name == name {
					return l
				}
			}
		}
	}
	return peerratelimit.RuleView{}
}

// The example through bin/caddy: CCR-I limited to 200/s per peer with 429,
// Retry-After and the message; another peer has its own limit; CCR-U is
// forwarded as received.
func TestHTTPStaticLimitsPerPeerAndType(t *testing.T) {
	metrics, load := metricServer(t)
	load.Store(10)
	front := e2e.Addr(t)
	// The PCRF group's egress limit would cap the sum of these bursts:
	// lift it, this test is about ingress.
	c := e2e.StartCaddy(t, "caddyfile", exampleConfig(t, front, metrics, "rate 800", "rate 100000"))
	c.WaitTCP(t, front)

	const secs = 3
	var a, b, u *outcome
	var wg sync.WaitGroup
	wg.Add(3)
	start := time.Now()
	go func() { defer wg.Done(); a = burst(t, "http://"+front+"/gx/ccr-i", "pgw2", secs*time.Second) }()
	go func() { defer wg.Done(); b = burst(t, "http://"+front+"/gx/ccr-i", "pgw1", secs*time.Second) }()
	go func() { defer wg.Done(); u = burst(t, "http://"+front+"/gx/ccr-u", "pgw3", secs*time.Second) }()
	wg.Wait()
	both := time.Since(start)
	// 200/s for the time the burst took plus the burst (10): never more.
	// The lower bound only shows the limit is not refusing far more than
	// it should: how fast the client can send depends on the machine.
	for name, o := range map[string]*outcome{"pgw2": a, "pgw1": b} {
		if got := o.ok.Load(); got > most(200, burstOf(200), o.elapsed) || got < 200*secs/2 {
			t.Errorf("%s CCR-I admitted %d in %v, want ~%d, at most %d", name, got, o.elapsed, 200*secs, most(200, burstOf(200), o.elapsed))
		}
		if o.rejected.Load() == 0 || o.other.Load() != 0 {
			t.Errorf("%s: %d rejected, %d other failures", name, o.rejected.Load(), o.other.Load())
		}
	}
	// Each peer has its own bucket: together they got more than one
	// bucket can ever admit in the time both bursts took. (Were the
	// bucket shared, the sum would be within that bound every time.)
	if sum, one := a.ok.Load()+b.ok.Load(), most(200, burstOf(200), both); sum <= one {
		t.Errorf("pgw2 and pgw1 admitted %d + %d CCR-I in %v: no more than one shared bucket's %d", a.ok.Load(), b.ok.Load(), both, one)
	}
	if ra, body := a.retryAfter.Load(), a.body.Load(); ra != "1" || body != "rate limit exceeded\n" {
		t.Errorf("rejection: Retry-After %v, body %q", ra, body)
	}
	// CCR-U has no limit of its own: past CCR-I's 200/s, up to the
	// overall 1000/s.
	if got := u.ok.Load(); got > most(1000, burstOf(1000), u.elapsed) || got <= 200*secs+10 {
		t.Errorf("CCR-U admitted %d in %v, want more than CCR-I's limit and at most the overall %d", got, u.elapsed, most(1000, burstOf(1000), u.elapsed))
	}
}

// Drop: past the limit the connection closes with nothing written.
func TestHTTPDropWritesNothing(t *testing.T) {
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "origin", upstream, 0)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	peer_rate_limit {
		profile any {
			rate 1 1
			action drop
		}
	}
	reverse_proxy %s
}`, front, upstream))
	c.WaitTCP(t, front)
	if first, err := sendClose(t, front); err != nil || !strings.HasPrefix(first, "HTTP/1.1 200") {
		t.Fatalf("first request: %q %v", first, err)
	}
	// Dropped: closed (EOF or reset) with nothing written, well before
	// the client's deadline.
	second, err := sendClose(t, front)
	if second != "" || !closedNotHung(err) {
		t.Fatalf("dropped request received %d bytes: %q (err %v); want a prompt close, nothing written", len(second), second, err)
	}
}

// sendClose sends one HTTP/1.1 request on a new connection and reads until
// the server closes it or 10 s pass; a refused dial fails the test.
func sendClose(t *testing.T, front string) (string, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", front, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", front)
	data, err := io.ReadAll(conn)
	return string(data), err
}

// closedNotHung reports whether a read that got nothing ended with the
// peer closing the connection (EOF, which ReadAll reports as nil, or a
// reset) rather than the client's own deadline.
func closedNotHung(err error) bool {
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// Dynamic throttling through bin/caddy follows the Prometheus metric: the
// admin view's effective CCR-I limit goes 200 → 120 at 62 % (40 %
// throttled), back by 20 points per hold below 50 %, and CCR-U (not
// dynamic) never changes.
func TestHTTPDynamicFollowsMetric(t *testing.T) {
	metrics, load := metricServer(t)
	load.Store(20)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", exampleConfig(t, front, metrics))
	c.WaitTCP(t, front)

	wait := func(want float64, what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			v := adminView(t, c)
			l := limitOf(v, "pgw2", "gx-ccr-i")
			if l.Effective == want {
				if o := limitOf(v, "pgw2", "overall"); o.Effective != 1000 {
					t.Fatalf("the overall limit moved to %v", o.Effective)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: effective CCR-I limit %v, want %v (%+v)", what, l.Effective, want, v)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait(200, "load 20 %")
	load.Store(62)
	wait(120, "load 62 %")
	load.Store(57)
	wait(140, "load 57 %")
	load.Store(67)
	wait(100, "load 67 %")
	load.Store(49)
	wait(140, "one hold below 50 %")  // 50 → 30
	wait(180, "two holds below 50 %") // 30 → 10
	wait(200, "three holds below 50 %")

	// The effective limit is what the handler enforces.
	load.Store(67)
	wait(100, "load 67 % again")
	// The burst follows the throttle: 100/s's, not 200/s's.
	if l := limitOf(adminView(t, c), "pgw2", "gx-ccr-t"); l.EffectiveBurst != burstOf(100) || l.Burst != burstOf(200) {
		t.Fatalf("CCR-T at 50 %% throttled: burst %d, effective burst %d; want %d and %d", l.Burst, l.EffectiveBurst, burstOf(200), burstOf(100))
	}
	o := burst(t, "http://"+front+"/gx/ccr-t", "pgw9", 2*time.Second)
	if got := o.ok.Load(); got > most(100, burstOf(100), o.elapsed) || got < 100*2/2 || o.rejected.Load() == 0 { // the burst follows the throttle
		t.Fatalf("CCR-T admitted %d in %v at 50 %% throttle (%d rejected), want ~200, at most %d", got, o.elapsed, o.rejected.Load(), most(100, burstOf(100), o.elapsed))
	}
	// An unreadable source keeps the level, says so, and counts it.
	load.Store(-1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := adminView(t, c)
		if d := handlerView(v, "gx-ingress").Dynamic; d != nil && d.LastError != "" {
			if d.ThrottlePercent != 50 || limitOf(v, "pgw2", "gx-ccr-i").Effective != 100 {
				t.Fatalf("level changed while the source was down: %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("source failure not shown: %+v", handlerView(v, "gx-ingress").Dynamic)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`caddy_edgesteer_peer_rate_limit_dynamic_load_source_errors_total{handler="gx-ingress"}`,
		`caddy_edgesteer_peer_rate_limit_dynamic_throttle_percent{handler="gx-ingress"} 50`,
		`caddy_edgesteer_peer_rate_limit_decisions_total{handler="gx-ingress",message_type="gx-ccr-t",profile="pgw2",verdict="rejected"}`,
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	c.WaitLog(t, "load source unreadable: keeping the last throttle level", 5*time.Second)
}

// Egress per upstream group: whichever upstream the load balancer picks,
// the group's limit applies just before forwarding. The OCS group (one
// peer) takes at most 100/s and the excess gets 503 with the group's
// message; the PCRF group's 800/s is shared by its two peers.
func TestHTTPEgressPerGroup(t *testing.T) {
	metrics, load := metricServer(t)
	load.Store(10)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", exampleConfig(t, front, metrics))
	c.WaitTCP(t, front)
	const secs = 2
	var gy, gx *outcome
	var wg sync.WaitGroup
	wg.Add(2)
	// Different ingress peers, so only the egress limits bite; more
	// workers for the PCRF group, so the client outruns its 800/s.
	go func() { defer wg.Done(); gy = burstPeers(t, "http://"+front+"/gy/ccr", secs*time.Second, 4) }()
	go func() { defer wg.Done(); gx = burstPeers(t, "http://"+front+"/gx/ccr-u", secs*time.Second, 8) }()
	wg.Wait()
	if got := gy.ok.Load(); got > most(100, burstOf(100), gy.elapsed) || got < 100*secs/2 || gy.rejected.Load() == 0 {
		t.Errorf("OCS group admitted %d in %v (rejected %d), want ~%d, at most %d", got, gy.elapsed, gy.rejected.Load(), 100*secs, most(100, burstOf(100), gy.elapsed))
	}
	if gy.status.Load() != 503 || gy.body.Load() != "OCS group overloaded\n" {
		t.Errorf("OCS refusal: %d %q", gy.status.Load(), gy.body.Load())
	}
	n := func(o *outcome, peer string) int64 {
		if v, ok := o.peers.Load(peer); ok {
			return v.(*atomic.Int64).Load()
		}
		return 0
	}
	if n(gy, "ocs") != gy.ok.Load() {
		t.Errorf("admitted Gy: %d, of which %d answered by ocs", gy.ok.Load(), n(gy, "ocs"))
	}
	// Both PCRF peers served, their sum within the group's limit, which
	// the client reached (a client too slow to reach it proves nothing).
	p1, p2 := n(gx, "pcrf1"), n(gx, "pcrf2")
	if p1 == 0 || p2 == 0 || p1+p2 > most(800, burstOf(800), gx.elapsed) || p1+p2 != gx.ok.Load() || gx.rejected.Load() == 0 {
		t.Errorf("PCRF group: pcrf1 %d + pcrf2 %d admitted of %d in %v (at most %d), %d rejected",
			p1, p2, gx.ok.Load(), gx.elapsed, most(800, burstOf(800), gx.elapsed), gx.rejected.Load())
	}
}

// burstPeers is burst from workers goroutines with a new ingress peer
// name per request.
func burstPeers(t *testing.T, url string, d time.Duration, workers int) *outcome {
	var seq atomic.Int64
	return burstWith(t, url, d, workers, func() string { return fmt.Sprint("peer-", seq.Add(1)) })
}

// layer4: connections per peer. A pGW address (in 127.0.0.0/29) past 50/s
// gets the message and a close; another address past 5/s is dropped with
// nothing written; admitted connections reach the upstream.
func TestLayer4ConnectionsPerPeer(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "rate-limit-l4.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	front, upstream := e2e.Addr(t), e2e.Addr(t)
	e2e.StartPeer(t, "peer", upstream, 0)
	c := e2e.StartCaddy(t, "caddyfile", strings.NewReplacer("127.0.0.1:3868", front, "127.0.0.1:3869", upstream).Replace(string(data)))
	c.WaitTCP(t, front)

	// A refused dial fails the test; a connection left open until the
	// client's deadline is "hung", never "dropped".
	connect := func(src string) string {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		conn, err := d.Dial("tcp", front)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
		body, err := io.ReadAll(conn)
		switch {
		case strings.Contains(string(body), "peer GET /"):
			return "admitted"
		case string(body) == "rate limit exceeded\n":
			return "rejected"
		case len(body) == 0 && closedNotHung(err):
			return "dropped"
		case len(body) == 0:
			return "hung"
		}
		return fmt.Sprintf("unexpected %q (%v)", body, err)
	}
	count := func(src string, d time.Duration) (map[string]int, time.Duration) {
		out := map[string]int{}
		start := time.Now()
		for end := start.Add(d); time.Now().Before(end); {
			out[connect(src)]++
		}
		return out, time.Since(start)
	}
	const secs = 2
	pgw, took := count("127.0.0.2", secs*time.Second)
	if pgw["admitted"] > int(most(50, 10, took)) || pgw["admitted"] == 0 || pgw["rejected"] == 0 || len(pgw) != 2 {
		t.Errorf("pGW connections in %v: %v; want at most %d admitted, the rest rejected", took, pgw, most(50, 10, took))
	}
	other, took := count("127.0.0.9", secs*time.Second)
	if other["admitted"] > int(most(5, 1, took)) || other["admitted"] == 0 || other["dropped"] == 0 || len(other) != 2 {
		t.Errorf("other connections in %v: %v; want at most %d admitted, the rest dropped", took, other, most(5, 1, took))
	}
	if v := handlerView(adminView(t, c), "l4-ingress"); v.Kind != "layer4" || len(v.Profiles) != 2 || v.Profiles[0].Keys == 0 {
		t.Errorf("admin view %+v", v)
	}
}
