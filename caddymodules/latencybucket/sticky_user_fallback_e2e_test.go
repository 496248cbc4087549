package latencybucket_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// fallbackConfig has, over the same two publishers (one bucket), an HTTP
// front and a layer4 front whose sticky_user is empty for the clients the
// test sends (no X-User header; no TLS, so no server name), once with the
// default fallback and once with sticky_user_fallback none. The HTTP
// server trusts 127.0.0.1 as a proxy, so the client IP is X-Forwarded-For's.
func fallbackConfig(fronts [4]string, pubs []string) string {
	ups := strings.Join(pubs, " ")
	l4 := func(front, name, fallback string) string {
		return fmt.Sprintf(`		%s {
			route {
				proxy %s {
					lb_policy latency_bucket {
						name %s
						probe http /probe
						probe_interval 200ms
						sticky_user {l4.tls.server_name}
						%s
					}
				}
			}
		}
`, front, ups, name, fallback)
	}
	site := func(front, name, fallback string) string {
		return fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy latency_bucket {
			name %s
			probe http /probe
			probe_interval 200ms
			sticky_user {http.request.header.X-User}
			%s
		}
		header_down X-Publisher-Decision {http.reverse_proxy.latency_bucket.decision}
	}
}
`, front, ups, name, fallback)
	}
	return "{\n\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}\n\tlayer4 {\n" +
		l4(fronts[2], "fb-l4", "") + l4(fronts[3], "fb-l4-none", "sticky_user_fallback none") + "\t}\n}\n" +
		site(fronts[0], "fb-http", "") + site(fronts[1], "fb-http-none", "sticky_user_fallback none")
}

// A sticky_user that comes out empty (a header the request lacks, a TLS
// server name a plain connection has not) does not make every such client
// share one pin: by default each client IP is its user (for HTTP the
// client IP honours trusted_proxies: here X-Forwarded-For), so 16 clients
// make 16 pins spread over both publishers, each kept; with
// sticky_user_fallback none they are not pinned at all. A request that has
// the header is pinned by it.
func TestStickyUserFallback(t *testing.T) {
	pubs, _ := publishers(t, 1*ms, 1*ms)
	var fronts [4]string
	for i := range fronts {
		fronts[i] = e2e.Addr(t)
	}
	c := e2e.StartCaddy(t, "caddyfile", fallbackConfig(fronts, pubs))
	for _, f := range fronts {
		c.WaitTCP(t, f)
	}
	for _, name := range []string{"fb-http", "fb-http-none", "fb-l4", "fb-l4-none"} {
		waitView(t, c, name, "measured both", allMeasured(2))
	}
	entries := func(name string) int { return view(t, c, name).StickyEntries }
	getFrom := func(front, ip, user string) answer {
		req, _ := http.NewRequest("GET", "http://"+front+"/", nil)
		req.Header.Set("X-Forwarded-For", ip)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := client.Do(req)
		if err != nil {
			return answer{err: err}
		}
		resp.Body.Close()
		return answer{peer: resp.Header.Get("X-Peer"), decision: resp.Header.Get("X-Publisher-Decision")}
	}

	// Default: the client IP (X-Forwarded-For) is the user.
	pins, seen := map[string]string{}, map[string]bool{}
	for i := range 16 {
		ip := fmt.Sprintf("192.0.2.%d", 10+i)
		a := getFrom(fronts[0], ip, "")
		if a.err != nil || a.decision != "new" {
			t.Fatalf("first request from %s: %+v", ip, a)
		}
		pins[ip], seen[a.peer] = a.peer, true
	}
	if n := entries("fb-http"); n != 16 || len(seen) != 2 {
		t.Fatalf("16 header-less clients: %d pins on %v; want 16 pins over both publishers", n, seen)
	}
	for round := range 3 {
		for ip, want := range pins {
			if a := getFrom(fronts[0], ip, ""); a.err != nil || a.peer != want || a.decision != "sticky" {
				t.Fatalf("round %d: %s got %+v, pinned to %s", round, ip, a, want)
			}
		}
	}
	if a := getFrom(fronts[0], "192.0.2.10", "alice"); a.err != nil || a.decision != "new" || entries("fb-http") != 17 {
		t.Fatalf("alice with a header from a pinned IP: %+v, %d pins; want her own new pin", a, entries("fb-http"))
	}

	// none: header-less requests are never pinned, and spread.
	seen = map[string]bool{}
	for i := range 40 {
		a := getFrom(fronts[1], fmt.Sprintf("192.0.2.%d", 10+i%4), "")
		if a.err != nil || a.decision != "new" {
			t.Fatalf("unpinned request %d: %+v", i, a)
		}
		seen[a.peer] = true
	}
	if n := entries("fb-http-none"); n != 0 || len(seen) != 2 {
		t.Fatalf("sticky_user_fallback none: %d pins, picks on %v; want none, both publishers", n, seen)
	}
	if a := getFrom(fronts[1], "192.0.2.10", "bob"); a.err != nil || entries("fb-http-none") != 1 {
		t.Fatalf("bob with a header: %+v, %d pins; want pinned", a, entries("fb-http-none"))
	}

	// layer4: the remote IP is the user when the server name is empty.
	l4pins, seen := map[string]string{}, map[string]bool{}
	for i := range 16 {
		src := fmt.Sprintf("127.0.0.%d", 60+i)
		peer, err := dialL4(fronts[2], src)
		if err != nil {
			t.Fatalf("layer4 from %s: %v", src, err)
		}
		l4pins[src], seen[peer] = peer, true
	}
	if n := entries("fb-l4"); n < 16 || n > 17 || len(seen) != 2 {
		// 17: the harness's readiness connection from 127.0.0.1, if it
		// came after the first probe round.
		t.Fatalf("16 layer4 sources: %d pins on %v; want 16 over both publishers", n, seen)
	}
	for src, want := range l4pins {
		if peer, err := dialL4(fronts[2], src); err != nil || peer != want {
			t.Fatalf("layer4 %s reached %s (%v), pinned to %s", src, peer, err, want)
		}
	}
	seen = map[string]bool{}
	for i := range 40 {
		peer, err := dialL4(fronts[3], "127.0.0.60")
		if err != nil {
			t.Fatalf("layer4 unpinned %d: %v", i, err)
		}
		seen[peer] = true
	}
	if n := entries("fb-l4-none"); n != 0 || len(seen) != 2 {
		t.Fatalf("layer4 sticky_user_fallback none: %d pins, picks on %v; want none, both publishers", n, seen)
	}
}
