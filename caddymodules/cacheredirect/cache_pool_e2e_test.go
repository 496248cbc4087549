package cacheredirect_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// On loopback through bin/caddy, with three caches (testpeers standing in
// for them, answering with their names): one URL always reaches the same
// cache, URLs spread over all three, a dead cache's URLs move to the
// survivors while the survivors' own URLs stay where they were (rendezvous
// hashing; a modulo hash would move most of them), and with no cache left
// cacheable requests fall back to the origin.
func TestURLHashCachesAndFallback(t *testing.T) {
	// Distinct loopback addresses, so no cache's IP is the test client's
	// (requests from a cache's IP are misses, sent to the origin).
	cacheA := "127.0.0.31:" + strconv.Itoa(e2e.FreePort(t))
	cacheB := "127.0.0.32:" + strconv.Itoa(e2e.FreePort(t))
	cacheC := "127.0.0.33:" + strconv.Itoa(e2e.FreePort(t))
	origin := e2e.Addr(t)
	a := e2e.StartPeer(t, "cache-a", cacheA, 0)
	b := e2e.StartPeer(t, "cache-b", cacheB, 0)
	cc := e2e.StartPeer(t, "cache-c", cacheC, 0)
	e2e.StartPeer(t, "origin", origin, 0)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	cache_redirect {
		caches %s %s %s
		origin %s
		cache_fail_duration 1m
	}
	header >X-Path {http.cache_redirect.path}
}`, front, cacheA, cacheB, cacheC, origin))
	c.WaitTCP(t, front)
	get := func(path string) (peer, route string) {
		t.Helper()
		resp, err := http.Get("http://" + front + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-Peer"), resp.Header.Get("X-Path")
	}
	owner := map[string]string{}
	count := map[string]int{}
	for i := range 60 {
		path := fmt.Sprintf("/obj/%d", i)
		peer, route := get(path)
		if route != "cache" || !strings.HasPrefix(peer, "cache-") {
			t.Fatalf("%s went to %q by %q", path, peer, route)
		}
		owner[path] = peer
		count[peer]++
		for range 3 {
			if again, _ := get(path); again != peer {
				t.Fatalf("%s went to %s, then %s", path, peer, again)
			}
		}
	}
	if count["cache-a"] < 8 || count["cache-b"] < 8 || count["cache-c"] < 8 {
		t.Fatalf("60 URLs spread %v", count)
	}
	// cache-b dies: the first request to one of its URLs fails over (a
	// retry to a survivor), then its URLs live on the survivors; the
	// survivors' own URLs do not move.
	b.Kill()
	moved := map[string]int{}
	for path, was := range owner {
		got, route := get(path)
		switch {
		case route != "cache" || got == "cache-b" || !strings.HasPrefix(got, "cache-"):
			t.Fatalf("after cache-b died, %s (was on %s) went to %q by %q", path, was, got, route)
		case was != "cache-b" && got != was:
			t.Errorf("after cache-b died, %s moved from %s to %s", path, was, got)
		case was == "cache-b":
			moved[got]++
		}
	}
	if moved["cache-a"] == 0 || moved["cache-c"] == 0 {
		t.Errorf("cache-b's URLs moved %v: want some on each survivor", moved)
	}
	// No cache left: cacheable requests go to the origin.
	a.Kill()
	cc.Kill()
	// The first requests find the dead caches (each a 502 or a retry)
	// until passive health has marked both down.
	for i := 0; i < 4; i++ {
		get(fmt.Sprintf("/obj/%d", i))
	}
	if peer, route := get("/obj/9"); peer != "origin" || route != "fallback" {
		t.Fatalf("with no cache: %q by %q", peer, route)
	}
}

// A cache that accepts connections and never answers: requests that reach
// it wait at most cache_timeout, are retried on the other cache and
// succeed; it is then skipped for cache_fail_duration, so later requests
// for its URLs go to the other cache at once and it sees no new connection.
func TestHangingCache(t *testing.T) {
	live := "127.0.0.31:" + strconv.Itoa(e2e.FreePort(t))
	e2e.StartPeer(t, "cache-live", live, 0)
	hung, accepted := e2e.HangingListener(t, "127.0.0.32:0")
	origin := e2e.Addr(t)
	e2e.StartPeer(t, "origin", origin, 0)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	cache_redirect {
		caches %s %s
		origin %s
		cache_timeout 1s
		cache_fail_duration 1m
	}
}`, front, live, hung, origin))
	c.WaitTCP(t, front)
	round := func(from, n int, together bool) {
		t.Helper()
		peers := make([]string, n)
		errs := make([]error, n)
		get := func(i int) {
			client := http.Client{Timeout: 20 * time.Second}
			resp, err := client.Get(fmt.Sprintf("http://%s/obj/%d", front, from+i))
			if err != nil {
				errs[i] = err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs[i] = fmt.Errorf("status %s", resp.Status)
			}
			peers[i] = resp.Header.Get("X-Peer")
		}
		if together {
			e2e.Together(n, get)
		} else {
			for i := range n {
				get(i)
			}
		}
		for i := range n {
			if errs[i] != nil || peers[i] != "cache-live" {
				t.Errorf("/obj/%d: %v, answered by %q, want cache-live", from+i, errs[i], peers[i])
			}
		}
	}
	round(0, 20, true) // a burst, some of it hashed to the hanging cache
	first := accepted.Load()
	if first == 0 {
		t.Fatal("no request of 20 was hashed to the hanging cache: the test shows nothing")
	}
	round(20, 20, false)
	if n := accepted.Load(); n != first {
		t.Errorf("the hanging cache got %d more connections after it failed, want none during cache_fail_duration", n-first)
	}
}
