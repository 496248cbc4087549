package peerratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// reloadHTTPConfig is an ingress handler (reload-in, per X-Peer) in front
// of a respond, and an egress group (reload-out) in front of a peer. gen
// is sent back in X-Gen, so a test sees which config answered.
func reloadHTTPConfig(front, upstream string, gen int, in, out string) string {
	return fmt.Sprintf(`http://%[1]s {
	bind 127.0.0.1
	header X-Gen %[3]d
	handle /in/* {
		peer_rate_limit {
			name reload-in
			profile peers {
				peer {http.request.header.X-Peer}
				rate %[4]s
			}
		}
		respond "ok" 200
	}
	handle /out/* {
		reverse_proxy %[2]s {
			transport peer_rate_limit {
				name reload-out
				group origin %[2]s {
					rate %[5]s
				}
			}
		}
	}
}`, front, upstream, gen, in, out)
}

// get sends a GET as peer and returns the status and X-Gen. A request
// that a reload's Shutdown closed unanswered on its first connection (see
// streamGet) is sent once more, as a browser does; it happened once to
// the first GET after a POST /load.
func get(t *testing.T, url, peer string) (int, string) {
	t.Helper()
	resp, unanswered, _, err := streamGet(url, peer)
	if unanswered {
		t.Logf("GET %s as %s: closed unanswered on a fresh connection (golang/go#75591); sent again", url, peer)
		resp, _, _, err = streamGet(url, peer)
	}
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Gen")
}

// A peer that has used up its burst (ingress) and a group that has used up
// its own (egress) get no fresh burst from a reload, by `caddy reload` or
// by POST /load; counters and the admin view go on from where they were.
func TestReloadKeepsExhaustedBuckets(t *testing.T) {
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "origin", upstream, 0)
	front := e2e.Addr(t)
	in, out := "http://"+front+"/in/x", "http://"+front+"/out/x"
	// 0.01/s: nothing refills within the test.
	c := e2e.StartCaddy(t, "caddyfile", reloadHTTPConfig(front, upstream, 1, "0.01 3", "0.01 3"))
	c.WaitTCP(t, front)
	for i := range 3 {
		if s, _ := get(t, in, "pgw1"); s != 200 {
			t.Fatalf("ingress request %d: %d", i, s)
		}
		if s, _ := get(t, out, fmt.Sprint("p", i)); s != 200 {
			t.Fatalf("egress request %d: %d", i, s)
		}
	}
	if s, _ := get(t, in, "pgw1"); s != 429 {
		t.Fatalf("past the ingress burst: %d", s)
	}
	if s, _ := get(t, out, "p9"); s != 503 {
		t.Fatalf("past the egress burst: %d", s)
	}
	series := `caddy_edgesteer_peer_rate_limit_decisions_total{handler="reload-in",message_type="other",profile="peers",verdict="admitted"}`
	for gen := 2; gen <= 3; gen++ {
		if gen == 2 {
			c.Reload(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, "0.01 3", "0.01 3"))
		} else {
			c.Load(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, "0.01 3", "0.01 3"))
		}
		if s, g := get(t, in, "pgw1"); s != 429 || g != fmt.Sprint(gen) {
			t.Fatalf("generation %d: the exhausted peer got %d from generation %s", gen, s, g)
		}
		if s, _ := get(t, out, "p9"); s != 503 {
			t.Fatalf("generation %d: the exhausted egress group got %d", gen, s)
		}
		if s, _ := get(t, in, fmt.Sprint("fresh", gen)); s != 200 {
			t.Fatalf("generation %d: a new peer got %d", gen, s)
		}
		if v, _ := c.Metric(t, series); v != float64(3+gen-1) {
			t.Fatalf("generation %d: admitted counter %v, want %d", gen, v, 3+gen-1)
		}
		v := adminView(t, c)
		if len(v) != 2 || handlerView(v, "reload-in").Profiles[0].Keys != gen || handlerView(v, "reload-out").Kind != "http-egress" {
			t.Fatalf("generation %d: admin view %+v", gen, v)
		}
	}
}

// streamCount is what a steady stream of requests got.
type streamCount struct {
	ok, refused, failed atomic.Int64
	// unanswered counts fresh connections closed without a byte of
	// answer during a reload, retried counts requests the client sent
	// again on its own after a kept-alive connection closed (see
	// streamGet).
	unanswered, retried atomic.Int64
	lastErr             atomic.Value
}

// streamGet sends one GET as peer. It reports the two ways a reload may
// make a request fail on its first connection, which only a reload may
// cause:
//   - closedUnanswered: Go's net/http server (golang/go#75591) closes,
//     without an answer, a connection it accepted just before Shutdown
//     began and whose first request it reads after. The client sees an
//     EOF on a connection that was not reused and sent no byte back, and
//     does not retry it on its own; the caller retries it once, as a
//     browser does.
//   - attempts > 1: the old generation closed an idle kept-alive
//     connection as the request went out on it, and net/http's client
//     sent the request again on another.
func streamGet(url, peer string) (resp *http.Response, closedUnanswered bool, attempts int64, err error) {
	var reused, answered atomic.Bool
	var conns atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			conns.Add(1)
			reused.Store(i.Reused)
		},
		GotFirstResponseByte: func() { answered.Store(true) },
	})
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("X-Peer", peer)
	resp, err = http.DefaultClient.Do(req)
	return resp, err != nil && errors.Is(err, io.EOF) && !reused.Load() && !answered.Load(), conns.Load(), err
}

// reloadSpans are the times a config generation is being replaced: from
// a reload's start to half a second after the new generation first
// answers.
type reloadSpans struct {
	mu    sync.Mutex
	spans [][2]time.Time // an open span ends at the zero time
}

func (r *reloadSpans) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, [2]time.Time{time.Now()})
}

func (r *reloadSpans) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans[len(r.spans)-1][1] = time.Now().Add(500 * time.Millisecond)
}

// during reports whether t falls in a reload's span.
func (r *reloadSpans) during(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if !t.Before(s[0]) && (s[1].IsZero() || !t.After(s[1])) {
			return true
		}
	}
	return false
}

// A steady stream from one peer, past its limit, across reloads: every
// request is answered, admitted or refused by the limiter. The one
// exception is net/http's (streamGet): during a reload, at most one fresh
// connection per reload closed unanswered, and its retry answered;
// outside a reload no request may need a second connection. A reload
// that lowers the rate and one that raises it take effect at once on the
// peer's bucket as it stands.
func TestReloadSteadyStreamAndChangedRate(t *testing.T) {
	// Reloads under traffic: without tcp_migrate_req Linux resets the
	// connections queued on the old generation's listener (a Caddy and
	// kernel matter, see the top README), so the test runs in a namespace
	// of its own with it set.
	if !e2e.InNamespace(t, "net.ipv4.tcp_migrate_req=1") {
		return
	}
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "origin", upstream, 0)
	front := e2e.Addr(t)
	url := "http://" + front + "/in/x"
	c := e2e.StartCaddy(t, "caddyfile", reloadHTTPConfig(front, upstream, 1, "20 1", "100000"))
	c.WaitTCP(t, front)

	var n streamCount
	var reloads reloadSpans
	var gens sync.Map // X-Gen seen → true
	stopStream := e2e.Loop(2, func(int) bool {
		start := time.Now()
		resp, unanswered, attempts, err := streamGet(url, "stream")
		if (unanswered || attempts > 1) && !reloads.during(start) && !reloads.during(time.Now()) {
			n.failed.Add(1)
			n.lastErr.Store(fmt.Sprintf("outside any reload: a request took %d connections (%v)", attempts, err))
			return true
		}
		if attempts > 1 {
			n.retried.Add(1)
		}
		if unanswered {
			n.unanswered.Add(1)
			n.lastErr.Store(err.Error())
			resp, _, _, err = streamGet(url, "stream")
		}
		if err != nil {
			n.failed.Add(1)
			n.lastErr.Store(err.Error())
			return true
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		gens.Store(resp.Header.Get("X-Gen"), true)
		switch resp.StatusCode {
		case 200:
			n.ok.Add(1)
		case 429:
			n.refused.Add(1)
		default:
			n.failed.Add(1)
			n.lastErr.Store(resp.Status)
		}
		return true
	})
	defer stopStream()
	waitGen := func(gen int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for _, seen := gens.Load(fmt.Sprint(gen)); !seen; _, seen = gens.Load(fmt.Sprint(gen)) {
			if time.Now().After(deadline) {
				t.Fatalf("generation %d never answered", gen)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGen(1)
	gen := 1
	for i := range 4 {
		gen++
		reloads.begin()
		if i%2 == 0 {
			c.Reload(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, "20 1", "100000"))
		} else {
			c.Load(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, "20 1", "100000"))
		}
		waitGen(gen)
		reloads.end()
		time.Sleep(300 * time.Millisecond)
	}
	// admitted returns how many the stream gets admitted over d, and the
	// time it really measured.
	admittedOver := func(d time.Duration) (int64, float64) {
		start, ok0 := time.Now(), n.ok.Load()
		time.Sleep(d)
		return n.ok.Load() - ok0, time.Since(start).Seconds()
	}
	for _, step := range []struct {
		rate   string
		perSec float64
		load   bool
	}{{"5 1", 5, false}, {"40 1", 40, true}} {
		gen++
		reloads.begin()
		if step.load {
			c.Load(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, step.rate, "100000"))
		} else {
			c.Reload(t, "caddyfile", reloadHTTPConfig(front, upstream, gen, step.rate, "100000"))
		}
		waitGen(gen)
		reloads.end()
		got, secs := admittedOver(2 * time.Second)
		// At most the new rate over the window, plus the burst of 1 and
		// one answer in flight per client from before it. The lower
		// bound only shows the new rate is in force, not the old one.
		if max := int64(step.perSec*secs) + 1 + 2; got > max || float64(got) < step.perSec*secs/2 {
			t.Errorf("rate %s: %d admitted in %.2fs after the reload, want at most %d and near the rate", step.rate, got, secs, max)
		}
	}
	stopStream()
	if n.failed.Load() != 0 || n.unanswered.Load() > int64(gen-1) || n.ok.Load() == 0 || n.refused.Load() == 0 {
		t.Fatalf("across %d reloads: %d admitted, %d refused by the limiter, %d failed, %d fresh connections closed unanswered during a reload (at most one per reload), %d sent again by the client during a reload (last error: %v)",
			gen-1, n.ok.Load(), n.refused.Load(), n.failed.Load(), n.unanswered.Load(), n.retried.Load(), n.lastErr.Load())
	}
	t.Logf("across %d reloads: %d admitted, %d refused by the limiter, 0 failed, %d fresh connections closed unanswered and answered on retry, %d sent again by the client, all during reloads",
		gen-1, n.ok.Load(), n.refused.Load(), n.unanswered.Load(), n.retried.Load())
	if l := limitOf(adminView(t, c), "peers", "overall"); l.Rate != 40 {
		t.Fatalf("admin view after the reloads: %+v", l)
	}
}

// reloadDynamicConfig throttles message m dynamically from the metric;
// table is its threshold lines.
func reloadDynamicConfig(front, metrics string, gen int, table string) string {
	return fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	header X-Gen %d
	peer_rate_limit {
		name reload-dyn
		profile peers {
			peer {http.request.header.X-Peer}
			rate 1000
			message m {
				match {
					path /m
				}
				rate 200
				dynamic
			}
		}
		dynamic {
			source prometheus %s db_cpu_percent host=db1
			interval 200ms
			%s
			reversal 50
			reversal_hold 5s
		}
	}
	respond "ok" 200
}`, front, gen, metrics, table)
}

// The dynamic throttle level and the reversal hold in progress survive
// reloads: the new generation's limits are throttled from its first
// request, the hold keeps its start (it is not restarted), and a new
// table whose top is below the level lowers it at once.
func TestReloadKeepsDynamicLevelAndHold(t *testing.T) {
	metrics, load := metricServer(t)
	load.Store(62)
	front := e2e.Addr(t)
	table := "threshold 55 30\n\t\t\tthreshold 60 40\n\t\t\tthreshold 65 50"
	c := e2e.StartCaddy(t, "caddyfile", reloadDynamicConfig(front, metrics, 1, table))
	c.WaitTCP(t, front)
	dyn := func() (*peerratelimit.DynamicView, float64) {
		v := adminView(t, c)
		return handlerView(v, "reload-dyn").Dynamic, limitOf(v, "peers", "m").Effective
	}
	waitFor := func(what string, ok func(*peerratelimit.DynamicView, float64) bool) *peerratelimit.DynamicView {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			d, eff := dyn()
			if d != nil && ok(d, eff) {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v, effective %v", what, d, eff)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("level 40 at 62 %", func(d *peerratelimit.DynamicView, eff float64) bool { return d.ThrottlePercent == 40 && eff == 120 })
	load.Store(45)
	held := waitFor("the hold starting below 50 %", func(d *peerratelimit.DynamicView, _ float64) bool { return !d.ReversalSince.IsZero() })
	t0 := held.ReversalSince

	// check reads the state right after a reload: the level (unless the
	// hold has legitimately ended already) and the hold's start.
	check := func(gen int, level int, eff float64) {
		t.Helper()
		if s, g := get(t, "http://"+front+"/x", "p"); s != 200 || g != fmt.Sprint(gen) {
			t.Fatalf("generation %d not in force: %d from %s", gen, s, g)
		}
		d, got := dyn()
		if d == nil {
			t.Fatalf("generation %d: no dynamic view", gen)
		}
		if d.ReversalSince.Sub(t0) >= 5*time.Second {
			t.Logf("generation %d: the 5 s hold ended before the check; level %d", gen, d.ThrottlePercent)
			return
		}
		if d.ThrottlePercent != level || got != eff || !d.ReversalSince.Equal(t0) {
			t.Fatalf("generation %d: level %d, effective %v, hold from %v; want %d, %v, hold from %v",
				gen, d.ThrottlePercent, got, d.ReversalSince, level, eff, t0)
		}
		if v, _ := c.Metric(t, `caddy_edgesteer_peer_rate_limit_dynamic_throttle_percent{handler="reload-dyn"}`); v != float64(level) {
			t.Fatalf("generation %d: throttle gauge %v", gen, v)
		}
	}
	c.Reload(t, "caddyfile", reloadDynamicConfig(front, metrics, 2, table))
	check(2, 40, 120)
	// A new table topping out at 30 %: the level drops to 30 at once.
	c.Load(t, "caddyfile", reloadDynamicConfig(front, metrics, 3, "threshold 55 20\n\t\t\tthreshold 60 30"))
	check(3, 30, 140)
	// The hold ends 5 s after it started, before the reloads: one step.
	d := waitFor("one step back", func(d *peerratelimit.DynamicView, eff float64) bool { return d.ThrottlePercent == 10 && eff == 180 })
	if d.ReversalSince.Sub(t0) < 5*time.Second {
		t.Fatalf("stepped back %v after the hold started, before its 5 s", d.ReversalSince.Sub(t0))
	}
}
