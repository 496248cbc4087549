package latencybucket_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// waitView polls the admin API until policy's view satisfies ok.
func waitView(t *testing.T, c *e2e.Caddy, policy string, what string, ok func(latencybucket.PolicyView) bool) latencybucket.PolicyView {
	t.Helper()
	var last []latencybucket.PolicyView
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		last = nil
		c.AdminJSON(t, "/latency_bucket/", &last)
		for _, v := range last {
			if v.Name == policy && ok(v) {
				return v
			}
		}
		time.Sleep(50 * ms)
	}
	t.Fatalf("policy %s never %s: %+v", policy, what, last)
	return latencybucket.PolicyView{}
}

// view returns policy's admin view now.
func view(t *testing.T, c *e2e.Caddy, policy string) latencybucket.PolicyView {
	t.Helper()
	return waitView(t, c, policy, "listed", func(latencybucket.PolicyView) bool { return true })
}

func allMeasured(n int) func(latencybucket.PolicyView) bool {
	return func(v latencybucket.PolicyView) bool {
		m := 0
		for _, p := range v.Publishers {
			if p.Measured && p.Active {
				m++
			}
		}
		return m == n && len(v.Publishers) == n
	}
}

func publisherView(v latencybucket.PolicyView, addr string) (latencybucket.PublisherView, bool) {
	for _, p := range v.Publishers {
		if p.Address == addr {
			return p, true
		}
	}
	return latencybucket.PublisherView{}, false
}

// reloadConfig is an HTTP and a layer4 policy over the same four
// publishers, all in one bucket; gen changes only an unrelated response
// header.
func reloadConfig(front, front4 string, pubs []string, gen int) string {
	ups := strings.Join(pubs, " ")
	return fmt.Sprintf(`{
	layer4 {
		%[2]s {
			route {
				proxy %[3]s {
					lb_policy latency_bucket {
						name reload-l4
						probe http /probe
						probe_interval 300ms
						probe_timeout 1s
					}
					lb_try_duration 5s
					lb_try_interval 50ms
				}
			}
		}
	}
}

http://%[1]s {
	bind 127.0.0.1
	reverse_proxy %[3]s {
		lb_policy latency_bucket {
			name reload-http
			probe http /probe
			probe_interval 300ms
			probe_timeout 1s
			sticky_user {http.request.header.X-User}
		}
		lb_retries 3
		header_down X-Publisher-Decision {http.reverse_proxy.latency_bucket.decision}
		header_down X-Generation %[4]d
	}
}
`, front, front4, ups, gen)
}

// pinCheck compares every pair's publisher with the first answers.
type pinCheck struct {
	get  func(user string) answer         // an HTTP request as user
	dial func(src string) (string, error) // a layer4 connection from src
	// keepAlive is get over reused connections, for the stream: see
	// TestReloadKeepsPinsAndMeasurements.
	keepAlive func(user string) answer
	http      map[string]string // user → publisher
	l4        map[string]string // source address → publisher
}

func (p *pinCheck) pin(t *testing.T) {
	t.Helper()
	p.http, p.l4 = map[string]string{}, map[string]string{}
	seenHTTP, seenL4 := map[string]bool{}, map[string]bool{}
	for i := range 50 {
		user := fmt.Sprint("user-", i)
		a := p.get(user)
		if a.err != nil || a.decision != "new" {
			t.Fatalf("pinning %s: %+v", user, a)
		}
		p.http[user] = a.peer
		seenHTTP[a.peer] = true
	}
	for i := range 16 {
		src := fmt.Sprintf("127.0.0.%d", 10+i)
		peer, err := p.dial(src)
		if err != nil {
			t.Fatalf("pinning %s: %v", src, err)
		}
		p.l4[src] = peer
		seenL4[peer] = true
	}
	// A fair test: with the pins spread over several publishers of one
	// bucket, losing the table would move most pairs.
	if len(seenHTTP) < 3 || len(seenL4) < 3 {
		t.Fatalf("pins on too few publishers: HTTP %v, layer4 %v", seenHTTP, seenL4)
	}
}

func (p *pinCheck) verify(t *testing.T, when string) {
	t.Helper()
	for user, want := range p.http {
		if a := p.get(user); a.err != nil || a.peer != want || a.decision != "sticky" {
			t.Fatalf("%s: %s got %+v, pinned to %s", when, user, a, want)
		}
	}
	for src, want := range p.l4 {
		if peer, err := p.dial(src); err != nil || peer != want {
			t.Fatalf("%s: %s reached %s (%v), pinned to %s", when, src, peer, err, want)
		}
	}
}

// stream sends requests of pinned users and connections of pinned sources,
// two workers each, until stopped, and counts failures and pins broken.
type stream struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	sent     atomic.Int64
	failed   atomic.Int64
	moved    atomic.Int64
	firstErr atomic.Value
}

func startStream(p *pinCheck) *stream {
	s := &stream{stop: make(chan struct{})}
	users := make([]string, 0, len(p.http))
	for u := range p.http {
		users = append(users, u)
	}
	srcs := make([]string, 0, len(p.l4))
	for src := range p.l4 {
		srcs = append(srcs, src)
	}
	run := func(w int, one func(i int) (ok, same bool, err error)) {
		defer s.wg.Done()
		for i := w; ; i += 2 {
			select {
			case <-s.stop:
				return
			default:
			}
			s.sent.Add(1)
			ok, same, err := one(i)
			if !ok {
				s.failed.Add(1)
				s.firstErr.CompareAndSwap(nil, fmt.Sprint(err))
			} else if !same {
				s.moved.Add(1)
			}
		}
	}
	for w := range 2 {
		s.wg.Add(2)
		go run(w, func(i int) (bool, bool, error) {
			u := users[i%len(users)]
			a := p.keepAlive(u)
			return a.err == nil, a.peer == p.http[u], a.err
		})
		go run(w, func(i int) (bool, bool, error) {
			src := srcs[i%len(srcs)]
			peer, err := p.dial(src)
			return err == nil, peer == p.l4[src], err
		})
	}
	return s
}

func (s *stream) finish(t *testing.T) {
	t.Helper()
	close(s.stop)
	s.wg.Wait()
	t.Logf("stream: %d requests and connections, %d failed, %d off their pin", s.sent.Load(), s.failed.Load(), s.moved.Load())
	if s.failed.Load() != 0 || s.moved.Load() != 0 {
		t.Fatalf("during the reloads %d of %d failed (first: %v), %d left their publisher",
			s.failed.Load(), s.sent.Load(), s.firstErr.Load(), s.moved.Load())
	}
}

// getRetryingUnanswered is getWith, sent once more when the request's
// connection was new and closed with no byte of answer: Go's net/http
// server (golang/go#75591) closes so a connection it accepted just before
// a reload's Shutdown began and whose request it reads after. A client
// does not retry a new connection on its own (only a reused one); a
// browser does. It happened to 1 request in 3,451 in a make test.
func getRetryingUnanswered(client *http.Client, url, user string) answer {
	var fresh, answered atomic.Bool
	trace := &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { fresh.Store(!i.Reused) },
		GotFirstResponseByte: func() { answered.Store(true) },
	}
	traced := &http.Client{Timeout: client.Timeout, Transport: traceTransport{client.Transport, trace}}
	a := getWith(traced, url, "", user)
	if a.err != nil && errors.Is(a.err, io.EOF) && fresh.Load() && !answered.Load() {
		a = getWith(client, url, "", user)
	}
	return a
}

// traceTransport sends each request through rt with trace.
type traceTransport struct {
	rt    http.RoundTripper
	trace *httptrace.ClientTrace
}

func (tt traceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return tt.rt.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), tt.trace)))
}

// Three reloads, each changing only an unrelated header, through the
// `caddy reload` CLI and through POST /load: 50 users pinned by the HTTP
// policy and 16 source addresses pinned by the layer4 policy keep their
// publishers, the admin view keeps its sticky entries and measurements,
// and a steady stream of requests and connections across the reloads has
// no failure.
//
// The stream's HTTP requests reuse connections, as browsers and API
// clients do (the old server closes its idle ones; the client's standard
// retry of a request on a reused connection closed before any answer
// covers that). Requests that each open a new connection lose about one
// in a few thousand across a reload inside Caddy's own server hand-over,
// before any handler runs: the same with `lb_policy random`, so not this
// policy's to fix (see the README). Layer4 connections are new each time.
func TestReloadKeepsPinsAndMeasurements(t *testing.T) {
	// Caddy binds a new listening socket per config (SO_REUSEPORT) and
	// closes the old one after a reload; without tcp_migrate_req the kernel
	// resets the connections still queued on the old socket, so a steady
	// stream loses a few connections per reload whatever the handlers do.
	// The README's Reloads section says so; the test sets it in a namespace
	// of its own.
	if !e2e.InNamespace(t, "net.ipv4.tcp_migrate_req=1") {
		return
	}
	for _, how := range []string{"caddy reload", "POST /load"} {
		t.Run(strings.ReplaceAll(how, "/", ""), func(t *testing.T) { testReloadKeepsPins(t, how) })
	}
}

func testReloadKeepsPins(t *testing.T, how string) {
	pubs, _ := publishers(t, 1*ms, 2*ms, 3*ms, 4*ms)
	front, front4 := e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", reloadConfig(front, front4, pubs, 0))
	c.WaitTCP(t, front)
	c.WaitTCP(t, front4)
	before := map[string]latencybucket.PolicyView{
		"reload-http": waitView(t, c, "reload-http", "measured all four", allMeasured(4)),
		"reload-l4":   waitView(t, c, "reload-l4", "measured all four", allMeasured(4)),
	}
	url := "http://" + front + "/"
	reused := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	p := &pinCheck{
		get:       func(user string) answer { return get(url, "", user) },
		keepAlive: func(user string) answer { return getRetryingUnanswered(reused, url, user) },
		dial:      func(src string) (string, error) { return dialL4(front4, src) },
	}
	p.pin(t)
	views := func() []latencybucket.PolicyView {
		var v []latencybucket.PolicyView
		c.AdminJSON(t, "/latency_bucket/", &v)
		return v
	}
	for _, v := range views() {
		before[v.Name] = v
	}
	if n := before["reload-http"].StickyEntries; n != 50 {
		t.Fatalf("HTTP sticky entries %d, want 50", n)
	}
	s := startStream(p)
	for gen := 1; gen <= 3; gen++ {
		time.Sleep(300 * ms) // the stream runs between reloads too
		cfg := reloadConfig(front, front4, pubs, gen)
		if how == "caddy reload" {
			c.Reload(t, "caddyfile", cfg)
		} else {
			c.Load(t, "caddyfile", cfg)
		}
		if h := p.get("user-0").generation; h != fmt.Sprint(gen) {
			t.Fatalf("after reload %d the front answers generation %q", gen, h)
		}
	}
	time.Sleep(300 * ms)
	s.finish(t)
	p.verify(t, "after 3 reloads")

	for _, now := range views() {
		was, ok := before[now.Name]
		if !ok {
			t.Errorf("new policy state %s after the reloads", now.Name)
			continue
		}
		if now.StateSince != was.StateSince || now.Generations != 1 {
			t.Errorf("%s: state since %v (was %v), %d generations", now.Name, now.StateSince, was.StateSince, now.Generations)
		}
		if now.StickyEntries != was.StickyEntries {
			t.Errorf("%s: sticky entries %d, were %d", now.Name, now.StickyEntries, was.StickyEntries)
		}
		for _, pw := range was.Publishers {
			pn, ok := publisherView(now, pw.Address)
			if !ok || !pn.Measured || pn.Rounds < pw.Rounds || pn.StickyEntries != pw.StickyEntries {
				t.Errorf("%s: publisher %s was %+v, now %+v", now.Name, pw.Address, pw, pn)
			}
		}
	}
}

// settingsConfig is a policy over pubs with bucket width w; probing is
// slow (once a minute) so that a round after the reload can only be one
// the reload asked for.
func settingsConfig(front string, pubs []string, w string) string {
	return fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy latency_bucket {
			name settings
			bucket_width %s
			probe http /probe
			probe_interval 1m
			probe_timeout 2s
			sticky_user {http.request.header.X-User}
		}
		lb_retries 3
		header_down X-Publisher-Decision {http.reverse_proxy.latency_bucket.decision}
	}
}
`, front, strings.Join(pubs, " "), w)
}

// A reload that changes the bucket width, removes a publisher and adds
// one: the adopted state shows the new width and buckets at once without a
// new probe round; pins of the remaining publishers stay (even one now in
// a higher bucket); pins of the removed one go and its users re-pick; the
// new publisher is probed at once, not a probe interval later.
func TestReloadAppliesSettingsToAdoptedState(t *testing.T) {
	// publisher-3 at 9 ms: [8,16) once buckets are 8 ms wide, with 7 ms
	// for a loaded host to add to its probes (at 12 ms one probed at
	// 16.2 ms with four test binaries beside it), as publisher-1 and -2
	// have in [0,8).
	pubs, _ := publishers(t, 1*ms, 2*ms, 9*ms, 3*ms, 1*ms)
	front := e2e.Addr(t)
	url := "http://" + front + "/"
	c := e2e.StartCaddy(t, "caddyfile", settingsConfig(front, pubs[:4], "32ms"))
	c.WaitTCP(t, front)
	was := waitView(t, c, "settings", "measured all four", allMeasured(4))
	pins := map[string]string{}
	per := map[string]int{}
	for i := range 60 {
		user := fmt.Sprint("u", i)
		a := get(url, "", user)
		if a.err != nil {
			t.Fatal(a.err)
		}
		pins[user] = a.peer
		per[a.peer]++
	}
	if len(per) != 4 || per["publisher-4"] == 0 {
		t.Fatalf("pins %v: want all four publishers (one bucket)", per)
	}
	was = view(t, c, "settings")

	// publisher-4 leaves, publisher-5 joins, buckets become 8 ms wide.
	c.Load(t, "caddyfile", settingsConfig(front, []string{pubs[0], pubs[1], pubs[2], pubs[4]}, "8ms"))
	now := waitView(t, c, "settings", "let go of publisher-4", func(v latencybucket.PolicyView) bool {
		_, listed := publisherView(v, pubs[3])
		return !listed && v.Generations == 1
	})
	if now.BucketWidthMS != 8 || now.StateSince != was.StateSince {
		t.Fatalf("after the reload: width %v ms, state since %v (was %v)", now.BucketWidthMS, now.StateSince, was.StateSince)
	}
	for i, want := range map[int]string{0: "[0,8)", 1: "[0,8)", 2: "[8,16)"} {
		p, ok := publisherView(now, pubs[i])
		pw, _ := publisherView(was, pubs[i])
		if !ok || p.Bucket != want || !p.Measured || !p.LastProbe.Equal(pw.LastProbe) || p.Rounds != pw.Rounds {
			t.Errorf("publisher-%d after the reload: %+v, want bucket %s from the kept measurement (before: %+v)", i+1, p, want, pw)
		}
	}
	if _, ok := publisherView(now, pubs[3]); ok {
		t.Errorf("removed publisher-4 still listed: %+v", now.Publishers)
	}
	if now.StickyEntries != 60-per["publisher-4"] {
		t.Errorf("sticky entries %d, want %d (publisher-4's %d pins gone)", now.StickyEntries, 60-per["publisher-4"], per["publisher-4"])
	}
	// The gauges read the adopted state (Caddy makes a new metrics
	// registry per config load), once per policy name.
	for series, want := range map[string]float64{
		`caddy_edgesteer_latency_bucket_publisher_bucket{policy="settings",publisher="` + pubs[2] + `"}`: 1, // [8,16)
		`caddy_edgesteer_latency_bucket_publisher_bucket{policy="settings",publisher="` + pubs[0] + `"}`: 0,
		`caddy_edgesteer_latency_bucket_sticky_entries{policy="settings"}`:                               float64(60 - per["publisher-4"]),
	} {
		if v, ok := c.Metric(t, series); !ok || v != want {
			t.Errorf("%s = %v (found %v), want %v", series, v, ok, want)
		}
	}
	if _, ok := c.Metric(t, `caddy_edgesteer_latency_bucket_publisher_active{policy="settings",publisher="`+pubs[3]+`"}`); ok {
		t.Error("the removed publisher-4 still has a gauge")
	}
	// Probed at once: a minute before the interval would come round.
	waitView(t, c, "settings", "measured publisher-5", func(v latencybucket.PolicyView) bool {
		p, ok := publisherView(v, pubs[4])
		return ok && p.Measured
	})

	for user, pinned := range pins {
		a := get(url, "", user)
		switch {
		case a.err != nil:
			t.Fatal(a.err)
		case pinned == "publisher-4":
			if a.peer == "publisher-4" || a.decision != "new" || (a.peer != "publisher-1" && a.peer != "publisher-2" && a.peer != "publisher-5") {
				t.Errorf("%s, pinned to the removed publisher-4, got %+v; want a new pick in [0,8)", user, a)
			}
		case a.peer != pinned || a.decision != "sticky":
			t.Errorf("%s moved from %s to %+v", user, pinned, a)
		}
	}
}

// Cold start: while no publisher has ever been measured (here the probe
// never succeeds: a TLS handshake with plain HTTP publishers), layer4
// connections and HTTP requests still go to the available publishers at
// random, and nothing is pinned.
func TestColdStartFallbackServes(t *testing.T) {
	pubs, _ := publishers(t, 0, 0, 0)
	front, front4 := e2e.Addr(t), e2e.Addr(t)
	ups := strings.Join(pubs, " ")
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%[2]s {
			route {
				proxy %[3]s {
					lb_policy latency_bucket {
						name cold-l4
						probe tls
						probe_interval 200ms
						probe_timeout 1s
					}
				}
			}
		}
	}
}

http://%[1]s {
	bind 127.0.0.1
	reverse_proxy %[3]s {
		lb_policy latency_bucket {
			name cold-http
			probe tls
			probe_interval 200ms
			probe_timeout 1s
			sticky_user {http.request.header.X-User}
		}
	}
}
`, front, front4, ups))
	c.WaitTCP(t, front)
	failedRounds := func(v latencybucket.PolicyView) bool {
		n := 0
		for _, p := range v.Publishers {
			if p.Rounds >= 2 && !p.Active && !p.Measured && p.LastError != "" {
				n++
			}
		}
		return n == 3
	}
	waitView(t, c, "cold-l4", "saw every probe fail", failedRounds)
	waitView(t, c, "cold-http", "saw every probe fail", failedRounds)

	seen := map[string]int{}
	for i := range 16 {
		src := fmt.Sprintf("127.0.0.%d", 40+i)
		for range 3 {
			peer, err := dialL4(front4, src)
			if err != nil {
				t.Fatalf("layer4 from %s before any measurement: %v", src, err)
			}
			seen[peer]++
		}
	}
	for i := range 48 {
		a := get("http://"+front+"/", "", fmt.Sprint("cold-", i%16))
		if a.err != nil {
			t.Fatalf("HTTP before any measurement: %v", a.err)
		}
		seen["http "+a.peer]++
	}
	if len(seen) != 6 {
		t.Fatalf("picks %v: want every publisher through both fronts", seen)
	}
	for _, name := range []string{"cold-l4", "cold-http"} {
		if v := view(t, c, name); v.StickyEntries != 0 {
			t.Errorf("%s pinned %d pairs before any measurement", name, v.StickyEntries)
		}
	}
}
