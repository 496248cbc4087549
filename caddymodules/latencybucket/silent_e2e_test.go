package latencybucket_test

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// silentConfig is an HTTP and a layer4 policy over the same two
// publishers, configured as the README's "A publisher that stops
// answering" rule asks: short probe rounds, retries, passive health, and
// for HTTP the transport's dial and response-header timeouts.
func silentConfig(front, front4 string, pubs []string) string {
	ups := strings.Join(pubs, " ")
	return fmt.Sprintf(`{
	layer4 {
		%[2]s {
			route {
				proxy %[3]s {
					lb_policy latency_bucket {
						name silent-l4
						probes 2
						probe_interval 500ms
						probe_timeout 500ms
					}
					lb_try_duration 5s
					lb_try_interval 50ms
					fail_duration 30s
				}
			}
		}
	}
}

http://%[1]s {
	bind 127.0.0.1
	reverse_proxy %[3]s {
		lb_policy latency_bucket {
			name silent-http
			probe http /probe
			probes 2
			probe_interval 500ms
			probe_timeout 500ms
			sticky_user {http.request.header.X-User}
		}
		lb_retries 3
		fail_duration 30s
		transport http {
			dial_timeout 1s
			response_header_timeout 2s
		}
		header_down X-Publisher-Decision {http.reverse_proxy.latency_bucket.decision}
	}
}
`, front, front4, ups)
}

// silence drops every packet sent to addr's port in the test's namespace:
// the publisher neither answers nor refuses, as a host that lost power or
// a firewall that drops would behave. Connections already open to it hang.
func silence(t *testing.T, addr string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	for _, args := range [][]string{
		{"add", "table", "inet", "lbsilent"},
		{"add", "chain", "inet", "lbsilent", "out", "{ type filter hook output priority 0 ; }"},
		{"add", "rule", "inet", "lbsilent", "out", "tcp", "dport", port, "drop"},
	} {
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// A publisher that stops answering mid-traffic without refusing (every
// packet to it dropped), under 8 concurrent HTTP clients on kept-alive
// connections and 4 concurrent layer4 clients, all pinned half to it: no
// HTTP request fails (the GETs in flight or dialled towards it time out at
// response_header_timeout or dial_timeout and are retried elsewhere, and
// passive health ends its pins); on layer 4 at most one connection per
// client fails (the one in flight or dialled before the probe round failed:
// caddy-l4 dials without a timeout, and its bytes cannot be replayed);
// every pair pinned to it moves to the other publisher and sticks there.
func TestSilentPublisherMidTraffic(t *testing.T) {
	// nft rules and fixed behaviour of loopback need a namespace of the
	// test's own.
	if !e2e.InNamespace(t) {
		return
	}
	pubs, _ := publishers(t, 1*ms, 1*ms)
	front, front4 := e2e.Addr(t), e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", silentConfig(front, front4, pubs))
	c.WaitTCP(t, front)
	c.WaitTCP(t, front4)
	waitView(t, c, "silent-http", "measured both", allMeasured(2))
	waitView(t, c, "silent-l4", "measured both", allMeasured(2))

	url := "http://" + front + "/"
	kept := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	users, pinHTTP := []string{}, map[string]string{}
	for i := range 32 {
		user := fmt.Sprint("user-", i)
		a := getWith(kept, url, "", user)
		if a.err != nil || a.decision != "new" {
			t.Fatalf("pinning %s: %+v", user, a)
		}
		users, pinHTTP[user] = append(users, user), a.peer
	}
	srcs, pinL4 := []string{}, map[string]string{}
	for i := range 16 {
		src := fmt.Sprintf("127.0.0.%d", 10+i)
		peer, err := dialL4(front4, src)
		if err != nil {
			t.Fatalf("pinning %s: %v", src, err)
		}
		srcs, pinL4[src] = append(srcs, src), peer
	}
	victim, victimAddr, other := "publisher-1", pubs[0], "publisher-2"
	onVictim := func(pins map[string]string) int {
		n := 0
		for _, p := range pins {
			if p == victim {
				n++
			}
		}
		return n
	}
	if n, m := onVictim(pinHTTP), onVictim(pinL4); n == 0 || n == len(pinHTTP) || m == 0 || m == len(pinL4) {
		t.Fatalf("pins: %d of %d users and %d of %d sources on %s; want both publishers used", n, len(pinHTTP), m, len(pinL4), victim)
	}

	var httpFailed, l4Failed, sent atomic.Int64
	var firstErr sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(kind string, n int, one func(i int) error) {
		for w := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; ; i += n {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					if err := one(i); err != nil {
						if kind == "http" {
							httpFailed.Add(1)
						} else {
							l4Failed.Add(1)
						}
						firstErr.LoadOrStore(kind, err)
					}
				}
			}()
		}
	}
	worker("http", 8, func(i int) error { return getWith(kept, url, "", users[i%len(users)]).err })
	worker("l4", 4, func(i int) error { _, err := dialL4(front4, srcs[i%len(srcs)]); return err })

	time.Sleep(500 * ms) // traffic flows to both publishers
	silence(t, victimAddr)
	for _, name := range []string{"silent-http", "silent-l4"} {
		waitView(t, c, name, "saw "+victim+" go inactive", func(v latencybucket.PolicyView) bool {
			p, ok := publisherView(v, victimAddr)
			return ok && !p.Active && p.LastError != ""
		})
	}
	time.Sleep(time.Second) // traffic goes on after the failed round
	close(stop)
	wg.Wait()
	h, l := httpFailed.Load(), l4Failed.Load()
	e1, _ := firstErr.Load("http")
	e2, _ := firstErr.Load("l4")
	t.Logf("%d requests and connections; %d HTTP failed (%v), %d layer4 failed (%v)", sent.Load(), h, e1, l, e2)
	if h != 0 || l > 4 {
		t.Fatalf("%d HTTP requests failed (want 0), %d layer4 connections failed (want at most 4, one per client)", h, l)
	}

	// Every pair is now on the other publisher, pinned again by the
	// stream's own requests, and sticks there.
	for user, was := range pinHTTP {
		if a := getWith(kept, url, "", user); a.err != nil || a.peer != other || a.decision != "sticky" {
			t.Fatalf("%s (pinned to %s) got %+v, want sticky on %s", user, was, a, other)
		}
	}
	for src, was := range pinL4 {
		if peer, err := dialL4(front4, src); err != nil || peer != other {
			t.Fatalf("%s (pinned to %s) reached %s (%v), want %s", src, was, peer, err, other)
		}
	}
	if v := view(t, c, "silent-http"); v.StickyEntries != len(pinHTTP) {
		t.Errorf("HTTP sticky entries %d, want %d (every user pinned again)", v.StickyEntries, len(pinHTTP))
	}
}
