package ntier_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ntier"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

// The cache (varnish) fetches its misses from the origin's own address;
// its route there goes through lower node l2b, which intercepts them (the
// seed's figure 3: L2NS3 intercepts the cache's fetch).
const transparentVCL = `vcl 4.1;
backend origin { .host = "203.0.113.80"; .port = "80"; }
sub vcl_recv {
	if (req.url == "/_varnish_ready") { return (synth(200)); }
}
sub vcl_deliver {
	set resp.http.X-Cache-Seen-Client-IP = req.http.Client-IP;
	if (obj.hits > 0) { set resp.http.X-Cache = "HIT"; } else { set resp.http.X-Cache = "MISS"; }
}
`

// seenRequest is what the origin (testpeer) recorded of a request.
type seenRequest struct {
	Remote   string `json:"remote"`
	Path     string `json:"path"`
	ClientIP string `json:"client_ip"`
}

// The transparent N-tier path, with the two transparent examples of
// Caddyfile.examples: client → upper (kernel only) → two lower nodes
// (bin/caddy: tproxy listener, cache_redirect) → varnish and an origin at
// 203.0.113.80, which the client fetches knowing nothing of the caches.
// Cacheable requests are served by varnish (a hit the second time) with
// the client's address in Client-IP; a bypass request is served by the
// origin, which sees the lower node's address and a source port of that
// node's range; varnish's miss reaches the origin through l2b, from l2b's
// range, with the client's address.
func TestTransparentTierWithVarnish(t *testing.T) {
	if _, err := exec.LookPath("varnishd"); err != nil {
		t.Fatal("varnishd is needed (Debian package varnish; make test installs it)")
	}
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "upper": 1, "l2a": 2, "l2b": 3, "cache": 5, "origin": 6})
	tp.EnableIPv6(t)
	clients := tp.ForwardVia(t, "upper", "client", "203.0.113.0/24", 4)
	clients6 := tp.ForwardVia6(t, "upper", "client", "2001:db8:80::/64", 4)
	tp.Run(t, "origin", "ip", "addr", "add", "203.0.113.80/32", "dev", "lo")
	tp.Run(t, "origin", "ip", "-6", "addr", "add", "2001:db8:80::80/128", "dev", "lo")
	for _, h := range []string{"l2a", "l2b"} {
		tp.Run(t, h, "ip", "route", "add", "203.0.113.0/24", "via", tp.IP("origin"))
		tp.Run(t, h, "ip", "-6", "route", "add", "2001:db8:80::/64", "via", tp.IP6("origin"))
	}
	tp.Run(t, "cache", "ip", "route", "add", "203.0.113.0/24", "via", tp.IP("l2b"))

	origin := tp.Start(t, "origin", "origin", e2e.Bin(t, "testpeer"), nil,
		"-listen", "203.0.113.80:80", "-name", "origin", "-cache-control", "max-age=300")
	// The same origin program answers on the IPv6 origin address.
	tp.Start(t, "origin", "origin6", e2e.Bin(t, "testpeer"), nil,
		"-listen", "[2001:db8:80::80]:80", "-name", "origin6", "-cache-control", "max-age=300")
	originSeenAt := func(o string) ([]seenRequest, error) {
		resp, err := tp.HTTPClient("origin").Get("http://" + o + "/_seen")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var s []seenRequest
		return s, json.NewDecoder(resp.Body).Decode(&s)
	}
	originSeen := func() ([]seenRequest, error) { return originSeenAt("203.0.113.80") }
	origin.WaitFor(t, "origin", 10*time.Second, func() error { _, err := originSeen(); return err })
	origin.WaitFor(t, "origin6", 10*time.Second, func() error { _, err := originSeenAt("[2001:db8:80::80]"); return err })

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "n.vcl"), []byte(transparentVCL), 0o644)
	tiers := fmt.Sprintf(`{"nodes":[{"name":"l2a","next_hop":%q,"next_hop6":%q},{"name":"l2b","next_hop":%q,"next_hop6":%q}]}`,
		tp.IP("l2a"), tp.IP6("l2a"), tp.IP("l2b"), tp.IP6("l2b"))
	os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(tiers), 0o644)
	m, err := srcports.Load(filepath.Join(dir, "tiers.json"))
	if err != nil {
		t.Fatal(err)
	}
	cache := tp.Start(t, "cache", "varnish", "varnishd", nil, "-F", "-j", "none", "-f", filepath.Join(dir, "n.vcl"),
		"-a", "10.77.0.5:6081", "-n", filepath.Join(dir, "varnish"), "-T", "127.0.0.1:0", "-s", "malloc,64m")
	cache.WaitFor(t, "varnish", 30*time.Second, func() error {
		resp, err := tp.HTTPClient("client").Get("http://10.77.0.5:6081/_varnish_ready")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	for _, node := range []string{"l2a", "l2b"} {
		tp.StartCaddy(t, node, example(t, "ntier-transparent-lower.Caddyfile"), dir,
			[]string{"NODE=" + node, "TIER_MAP=" + filepath.Join(dir, "tiers.json"), "CACHES=10.77.0.5:6081"})
	}
	tp.StartCaddy(t, "upper", example(t, "ntier-transparent-upper.Caddyfile"), dir, upperEnv(dir))

	names := []string{"l2a", "l2b"}
	assign := ntier.Assign(names, []bool{true, true}, ntier.DefaultBuckets)
	fetch := func(src netip.Addr, path string) *http.Response {
		t.Helper()
		client := clientFrom(tp, src, 10*time.Second)
		resp, err := client.Get("http://" + netip.AddrPortFrom(netip.MustParseAddr(originFor(src)), 80).String() + path)
		if err != nil {
			t.Fatalf("client %s GET %s: %v", src, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// source checks that the origin saw path from node's address and a
	// port of node's range, and returns the Client-IP it saw.
	source := func(path, node string, v6 bool) string {
		t.Helper()
		at, nodeIP := "203.0.113.80", tp.IP(node)
		if v6 {
			at, nodeIP = "[2001:db8:80::80]", tp.IP6(node)
		}
		s, err := originSeenAt(at)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range s {
			if x.Path != path {
				continue
			}
			host, p, _ := net.SplitHostPort(x.Remote)
			port, _ := strconv.Atoi(p)
			owner, _ := m.Owner(uint16(port))
			if host != nodeIP || owner.Name != node {
				t.Errorf("origin saw %s from %s (port owned by %q), want node %s (%s) and its range", path, x.Remote, owner.Name, node, nodeIP)
			}
			return x.ClientIP
		}
		t.Errorf("origin never saw %s", path)
		return ""
	}
	served := map[string]int{}
	for i, c := range append(slices.Clone(clients), clients6...) {
		node := names[assign[ntier.Bucket(c, ntier.DefaultSeed, ntier.DefaultBuckets)]]
		served[fmt.Sprint(node, " v", map[bool]int{true: 6, false: 4}[c.Is6()])]++
		obj := fmt.Sprintf("/img/%d.png", i)
		first, second := fetch(c, obj), fetch(c, obj)
		if first.StatusCode != 200 || first.Header.Get("X-Cache") != "MISS" || second.Header.Get("X-Cache") != "HIT" {
			t.Errorf("client %s %s: %s X-Cache %q then %q, want MISS then HIT", c, obj, first.Status, first.Header.Get("X-Cache"), second.Header.Get("X-Cache"))
		}
		if got, want := second.Header.Get("X-Cache-Path"), node+" cache"; got != want {
			t.Errorf("client %s %s: X-Cache-Path %q, want %q", c, obj, got, want)
		}
		if got := second.Header.Get("X-Cache-Seen-Client-IP"); got != c.String() {
			t.Errorf("client %s: varnish saw Client-IP %q", c, got)
		}
		if ip := source(obj, "l2b", false); ip != c.String() { // varnish's backend is the IPv4 origin
			t.Errorf("client %s: the miss reached the origin with Client-IP %q", c, ip)
		}
		api := fmt.Sprintf("/api/%d", i)
		resp := fetch(c, api)
		if got, want := resp.Header.Get("X-Cache-Path"), node+" bypass"; resp.StatusCode != 200 || got != want || resp.Header.Get("X-Cache") != "" {
			t.Errorf("client %s %s: %s X-Cache-Path %q (want %q) X-Cache %q", c, api, resp.Status, got, want, resp.Header.Get("X-Cache"))
		}
		if ip := source(api, node, c.Is6()); ip != c.String() {
			t.Errorf("client %s: the bypass reached the origin with Client-IP %q", c, ip)
		}
	}
	if len(served) != 4 {
		t.Errorf("the clients covered only %v: both nodes must serve each family", served)
	}
	t.Logf("clients per node: %v", served)
}
