package latencybucket_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// answering starts an HTTP upstream in the test: GET /health answers at
// once (so probes find it close), every other path after delay; answers
// carry X-Peer: name.
func answering(t *testing.T, name string, delay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			time.Sleep(delay)
		}
		w.Header().Set("X-Peer", name)
		fmt.Fprintln(w, name)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// publisherOf returns the admin view's publisher at addr.
func publisherOf(v latencybucket.PolicyView, addr string) latencybucket.PublisherView {
	for _, p := range v.Publishers {
		if p.Address == addr {
			return p
		}
	}
	return latencybucket.PublisherView{}
}

// Two publishers equally close by probe (GET /health), one of which answers
// real requests 150 ms late. With latency traffic or both, new users go to
// the fast one and users pinned to the slow one move at their next request
// (it is out of the lowest bucket); with latency probe (the default, even
// with the transport timing every request) nothing changes: the slow one
// keeps its pins and its share of new users.
func TestTrafficLatencyHTTP(t *testing.T) {
	for _, mode := range []string{"probe", "traffic", "both"} {
		t.Run(mode, func(t *testing.T) {
			fast, slow := answering(t, "fast", 0), answering(t, "slow", 150*ms)
			front := e2e.Addr(t)
			cfg := example(t, "publisher-selection-traffic.Caddyfile",
				"127.0.0.1:8080", front, "127.0.0.1:9001", fast, "127.0.0.1:9002", slow,
				"latency both", "latency "+mode, "traffic_half_life 10s", map[bool]string{true: "", false: "traffic_half_life 10s"}[mode == "probe"],
				"probe_interval 2s", "probe_interval 300ms")
			c := e2e.StartCaddy(t, "caddyfile", cfg)
			c.WaitTCP(t, front)
			adminView(t, c, "apps-traffic", 2)
			url := "http://" + front + "/"

			// Pin 20 users at once: every pick is made before any answer.
			pins := make([]string, 20)
			for i, a := range burst(t, url, names("user", len(pins))) {
				pins[i] = a.peer
			}
			onSlow := 0
			for _, p := range pins {
				if p == "slow" {
					onSlow++
				}
			}
			if onSlow == 0 || onSlow == len(pins) {
				t.Fatalf("pins not spread over both publishers: %v", pins)
			}

			// The slow answers are observed; with traffic or both the slow
			// publisher leaves the fast one's bucket.
			var sp latencybucket.PublisherView
			deadline := time.Now().Add(20 * time.Second)
			for {
				var views []latencybucket.PolicyView
				c.AdminJSON(t, "/latency_bucket/", &views)
				for _, v := range views {
					if v.Name == "apps-traffic" {
						sp = publisherOf(v, slow)
						fp := publisherOf(v, fast)
						if sp.ObservedSamples > 0 && (mode == "probe" || sp.Bucket != fp.Bucket) {
							goto observed
						}
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("slow publisher never observed as slow: %+v", sp)
				}
				time.Sleep(100 * ms)
			}
		observed:
			if sp.ObservedPeakMS < 100 {
				t.Fatalf("observed peak %v ms for a publisher answering in 150 ms: %+v", sp.ObservedPeakMS, sp)
			}
			wantBy := map[string]string{"probe": "probe", "traffic": "traffic", "both": "traffic"}[mode]
			if sp.DecidedBy != wantBy || sp.ProbeLatencyMS > 50 {
				t.Fatalf("slow publisher: decided by %q (want %q), probe latency %v ms", sp.DecidedBy, wantBy, sp.ProbeLatencyMS)
			}
			time.Sleep(time.Second) // let the views settle: several re-evaluations

			// Pinned users: per the rule.
			for i, was := range pins {
				a := get(url, "", fmt.Sprintf("user-%d", i))
				if a.err != nil {
					t.Fatal(a.err)
				}
				switch {
				case mode == "probe" && (a.peer != was || a.decision != "sticky"):
					t.Fatalf("probe: user-%d moved from %s to %s (%s)", i, was, a.peer, a.decision)
				case mode != "probe" && a.peer != "fast":
					t.Fatalf("%s: user-%d pinned to %s is now on %s (%s), want fast", mode, i, was, a.peer, a.decision)
				case mode != "probe" && was == "fast" && a.decision != "sticky":
					t.Fatalf("%s: user-%d on the fast publisher was re-picked (%s)", mode, i, a.decision)
				}
			}
			// New users.
			got := map[string]int{}
			for i := range 20 {
				a := get(url, "", fmt.Sprintf("new-%d", i))
				if a.err != nil {
					t.Fatal(a.err)
				}
				got[a.peer]++
			}
			if mode == "probe" && got["slow"] == 0 {
				t.Fatalf("probe: the close slow publisher got no new user: %v", got)
			}
			if mode != "probe" && got["slow"] != 0 {
				t.Fatalf("%s: new users went to the slow publisher: %v", mode, got)
			}
			t.Logf("%s: %d of 20 pinned to slow; new users %v; slow publisher %+v", mode, onSlow, got, sp)
		})
	}
}
