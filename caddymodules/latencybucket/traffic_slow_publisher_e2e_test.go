package latencybucket_test

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// upstream is an HTTP publisher the test steers: GET /health (the probe
// path) answers after probeDelay, every other request after delay, or once
// after slowOnce (armed: the next request only). Answers carry X-Peer.
type upstream struct {
	name, addr string
	delay      atomic.Int64 // ns
	probeDelay atomic.Int64 // ns
	slowOnce   atomic.Int64 // ns, taken by the next proxied request
}

func startUpstream(t *testing.T, name string) *upstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{name: name, addr: l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			time.Sleep(time.Duration(u.probeDelay.Load()))
		} else {
			time.Sleep(time.Duration(u.delay.Load() + u.slowOnce.Swap(0)))
		}
		w.Header().Set("X-Peer", name)
		fmt.Fprintln(w, name)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return u
}

// burst sends one request per user, all at once (every pick is made before
// any answer), and returns each user's answer.
func burst(t *testing.T, url string, users []string) []answer {
	t.Helper()
	out := make([]answer, len(users))
	e2e.Together(len(users), func(i int) { out[i] = get(url, "", users[i]) })
	for i, a := range out {
		if a.err != nil {
			t.Fatalf("%s: %v", users[i], a.err)
		}
	}
	return out
}

func count(as []answer, peer string) int {
	n := 0
	for _, a := range as {
		if a.peer == peer {
			n++
		}
	}
	return n
}

// trafficTrio runs publisher-selection-traffic.Caddyfile (its upstreams
// replaced by three steered publishers; half-life 2 s and probes every
// 300 ms so that a test takes seconds) with latency mode, and pins 30
// users, spread over the three.
func trafficTrio(t *testing.T, mode string) (c *e2e.Caddy, url string, ups []*upstream, users []string, pins []answer, config func(extra ...string) string) {
	t.Helper()
	ups = []*upstream{startUpstream(t, "a"), startUpstream(t, "b"), startUpstream(t, "c")}
	front := e2e.Addr(t)
	halfLife := "traffic_half_life 2s"
	if mode == "probe" {
		halfLife = "" // refused with latency probe
	}
	config = func(extra ...string) string {
		return example(t, "publisher-selection-traffic.Caddyfile", append([]string{
			"127.0.0.1:8080", front,
			"127.0.0.1:9001 127.0.0.1:9002", ups[0].addr + " " + ups[1].addr + " " + ups[2].addr,
			"latency both", "latency " + mode, "traffic_half_life 10s", halfLife,
			"probe_interval 2s", "probe_interval 300ms",
			// Wide buckets: on a loaded two-core host, a burst of 30
			// concurrent requests through Caddy takes some 25 ms to its
			// headers even from an instant upstream, its peaks cross 32 ms,
			// and at a load average of 17 two answers in a row took over
			// 220 ms (see the README's "Choosing bucket_width").
			"name apps-traffic", "name apps-traffic\n\t\t\tbucket_width 500ms"}, extra...)...)
	}
	c = e2e.StartCaddy(t, "caddyfile", config())
	c.WaitTCP(t, front)
	adminView(t, c, "apps-traffic", 3)
	url = "http://" + front + "/"
	users = names("user", 30)
	pins = burst(t, url, users)
	for _, u := range ups {
		if count(pins, u.name) < 2 {
			t.Fatalf("pins not spread over the three publishers: %v", pins)
		}
	}
	// Twice more, so that every publisher has a history of fast answers.
	for range 2 {
		stayed(t, burst(t, url, users), pins, "with every publisher fast")
	}
	return c, url, ups, users, pins, config
}

// stayed fails unless every user is on its pinned publisher, sticky.
func stayed(t *testing.T, got, pins []answer, when string) {
	t.Helper()
	for i, a := range got {
		if a.peer != pins[i].peer || a.decision != "sticky" {
			t.Fatalf("%s: user-%d pinned to %s answered by %s (%s)", when, i, pins[i].peer, a.peer, a.decision)
		}
	}
}

// policyView is the admin view of apps-traffic now; pub its publisher u.
func policyView(t *testing.T, c *e2e.Caddy) latencybucket.PolicyView {
	t.Helper()
	return view(t, c, "apps-traffic")
}

func pub(v latencybucket.PolicyView, u *upstream) latencybucket.PublisherView {
	return publisherOf(v, u.addr)
}

// Three publishers equally close by probe (GET /health); c turns slow in
// its real answers (1.5 s) while its probe path stays fast, then recovers.
// Requests arrive in concurrent bursts.
//
//   - A burst in which every publisher answers one request slowly moves no
//     pinned user, in any mode (an answer counts only when confirmed by the
//     next; the figure then is min(this, previous)).
//   - probe: c keeps its pins and its share of new users, although the
//     admin view shows its slow observed figure.
//   - traffic and both: one slow answer from c does not move it; the second
//     in a row does, at the next re-evaluation: c leaves the lowest bucket
//     with no further request to it, decided by traffic. Then every user
//     pinned to c is re-picked onto a or b at its next request (and sticks
//     there), users on a and b stay sticky, and no new user goes to c.
//     A `caddy reload` keeps c's observed figures (samples, peak, decided
//     by traffic, out of the lowest bucket). When c is fast again it gets
//     no traffic, so its figure decays towards its probe latency with the
//     half-life; once back in the lowest bucket new users go to it again,
//     and the users that left it stay where they are (sticky).
func TestTrafficThreePublishersSlowAnswers(t *testing.T) {
	for _, mode := range []string{"probe", "traffic", "both"} {
		t.Run(mode, func(t *testing.T) {
			c, url, ups, users, pins, config := trafficTrio(t, mode)
			a, b, slow := ups[0], ups[1], ups[2]

			// One slow answer per publisher, in one burst of every user.
			for _, u := range ups {
				u.slowOnce.Store(int64(1500 * ms))
			}
			stayed(t, burst(t, url, users), pins, "during a burst with one slow answer per publisher")
			for _, u := range ups {
				if u.slowOnce.Load() != 0 {
					t.Fatalf("publisher %s answered no slow request", u.name)
				}
			}
			time.Sleep(time.Second) // four re-evaluations
			stayed(t, burst(t, url, users), pins, "after a burst with one slow answer per publisher")
			v := policyView(t, c)
			for _, u := range ups {
				if p := pub(v, u); p.Bucket != "[0,500)" {
					t.Fatalf("one slow answer moved publisher %s to %s: %+v", u.name, p.Bucket, p)
				}
			}

			// c turns slow: one request of a user pinned to it...
			var onSlow []string
			for i, p := range pins {
				if p.peer == slow.name {
					onSlow = append(onSlow, users[i])
				}
			}
			slow.delay.Store(int64(1500 * ms))
			if got := get(url, "", onSlow[0]); got.err != nil || got.peer != slow.name {
				t.Fatalf("%s: %+v", onSlow[0], got)
			}
			time.Sleep(time.Second)
			if p := pub(policyView(t, c), slow); p.Bucket != "[0,500)" {
				t.Fatalf("%s: one slow answer moved c to %s: %+v", mode, p.Bucket, p)
			}
			// ...and a second one: c's figure is now slow.
			if got := get(url, "", onSlow[1]); got.err != nil || got.peer != slow.name {
				t.Fatalf("%s: %+v", onSlow[1], got)
			}
			var sp latencybucket.PublisherView
			if mode == "probe" {
				waitView(t, c, "apps-traffic", "observed c slow", func(v latencybucket.PolicyView) bool {
					return pub(v, slow).ObservedPeakMS > 1000
				})
				time.Sleep(time.Second)
				v = policyView(t, c)
				if sp = pub(v, slow); sp.Bucket != "[0,500)" || sp.DecidedBy != "probe" {
					t.Fatalf("probe: the slow answers moved c: %+v", sp)
				}
				stayed(t, burst(t, url, users), pins, "probe, c slow")
				news := burst(t, url, names("new", 30))
				if n := count(news, slow.name); n < 2 {
					t.Fatalf("probe: c, close by probe, got %d of 30 new users", n)
				}
				t.Logf("probe: c observed %+v; new users on c: %d of 30", sp, count(news, slow.name))
				return
			}
			v = waitView(t, c, "apps-traffic", "c out of the lowest bucket", func(v latencybucket.PolicyView) bool {
				return pub(v, slow).Bucket != pub(v, a).Bucket
			})
			sp = pub(v, slow)
			if sp.DecidedBy != "traffic" || sp.ObservedPeakMS < 1000 || sp.ProbeLatencyMS > 50 {
				t.Fatalf("%s: c left the lowest bucket, but: %+v", mode, sp)
			}
			if pub(v, a).Bucket != "[0,500)" || pub(v, b).Bucket != "[0,500)" {
				t.Fatalf("%s: a or b left [0,32): %+v", mode, v.Publishers)
			}

			// Pinned users: those on c move to a or b at their next request;
			// the others stay; then everyone sticks.
			moved := burst(t, url, users)
			for i, got := range moved {
				switch {
				case pins[i].peer == slow.name && (got.peer == slow.name || got.decision != "new"):
					t.Fatalf("%s: user-%d pinned to c answered by %s (%s), want a re-pick onto a or b", mode, i, got.peer, got.decision)
				case pins[i].peer != slow.name && (got.peer != pins[i].peer || got.decision != "sticky"):
					t.Fatalf("%s: user-%d pinned to %s answered by %s (%s)", mode, i, pins[i].peer, got.peer, got.decision)
				}
			}
			stayed(t, burst(t, url, users), moved, mode+": after the move")
			if n := count(burst(t, url, names("new", 30)), slow.name); n != 0 {
				t.Fatalf("%s: %d of 30 new users went to c", mode, n)
			}

			// A reload keeps the observed figures.
			before := pub(policyView(t, c), slow)
			c.Reload(t, "caddyfile", config("probe_timeout 1s", "probe_timeout 900ms"))
			waitView(t, c, "apps-traffic", "reloaded", func(v latencybucket.PolicyView) bool { return v.Generations == 1 })
			after := pub(policyView(t, c), slow)
			if after.ObservedSamples != before.ObservedSamples || after.DecidedBy != "traffic" || after.Bucket == "[0,500)" {
				t.Fatalf("%s: the reload lost c's observed figures: before %+v, after %+v", mode, before, after)
			}
			if n := count(burst(t, url, names("after-reload", 30)), slow.name); n != 0 {
				t.Fatalf("%s: after the reload %d of 30 new users went to c", mode, n)
			}

			// Recovery: idle, c's figure decays to its probe latency.
			slow.delay.Store(0)
			waitView(t, c, "apps-traffic", "c back in the lowest bucket", func(v latencybucket.PolicyView) bool {
				return pub(v, slow).Bucket == "[0,500)"
			})
			back := burst(t, url, names("later", 30))
			if n := count(back, slow.name); n < 2 {
				t.Fatalf("%s: c recovered but got %d of 30 new users", mode, n)
			}
			stayed(t, burst(t, url, users), moved, mode+": after c recovered")
			t.Logf("%s: %d users moved off c; c when left %+v, after reload %+v; new users after recovery on c: %d of 30",
				mode, len(onSlow), sp, after, count(back, slow.name))
		})
	}
}

// A publisher slow only on its probe path (GET /health 700 ms, real
// answers fast): latency traffic ignores it — its pinned users stay and it
// keeps its share of new users — while latency both does not: it leaves the
// lowest bucket (decided by probe), its pinned users move at their next
// request, and no new user goes to it.
func TestTrafficThreePublishersSlowProbe(t *testing.T) {
	for _, mode := range []string{"traffic", "both"} {
		t.Run(mode, func(t *testing.T) {
			c, url, ups, users, pins, _ := trafficTrio(t, mode)
			slowProbe := ups[2]
			slowProbe.probeDelay.Store(int64(700 * ms))
			// The probe latency is the minimum over the window (3 rounds):
			// wait for it, under traffic from every pinned user.
			waitView(t, c, "apps-traffic", "c's probe latency up", func(v latencybucket.PolicyView) bool {
				burst(t, url, users[:6])
				return pub(v, slowProbe).ProbeLatencyMS > 600
			})
			time.Sleep(time.Second)
			got := burst(t, url, users)
			news := burst(t, url, names("new", 30))
			p := pub(policyView(t, c), slowProbe)
			if mode == "traffic" {
				stayed(t, got, pins, "traffic, c slow to probe only")
				if p.Bucket != "[0,500)" || p.DecidedBy != "traffic" {
					t.Fatalf("traffic: c slow only to probe left the lowest bucket: %+v", p)
				}
				if n := count(news, slowProbe.name); n < 2 {
					t.Fatalf("traffic: c got %d of 30 new users", n)
				}
			} else {
				for i, a := range got {
					if pins[i].peer == slowProbe.name && a.peer == slowProbe.name {
						t.Fatalf("both: user-%d still on c, slow to probe: %+v", i, p)
					}
				}
				if p.Bucket == "[0,500)" || p.DecidedBy != "probe" {
					t.Fatalf("both: c slow to probe: %+v", p)
				}
				if n := count(news, slowProbe.name); n != 0 {
					t.Fatalf("both: %d of 30 new users went to c, slow to probe", n)
				}
			}
			t.Logf("%s: c %+v; new users on c %d of 30", mode, p, count(news, slowProbe.name))
		})
	}
}
