package cacheredirect_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/cacheredirect"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

// NetScaler's N-tier topology, one network namespace per host: client, upper tier,
// two lower-tier nodes, a varnish cache, an origin; bin/caddy runs the two
// example Caddyfiles, curl is the client.
type ntier struct {
	tp     *e2e.Topology
	tiers  *srcports.Map
	origin string // origin's /_seen URL
	// observer is the host the test reads /_seen from (default client).
	observer string
}

// seen is what the origin recorded of a request (testpeer's /_seen).
type seen struct {
	Remote   string `json:"remote"`
	Path     string `json:"path"`
	ClientIP string `json:"client_ip"`
	XFF      string `json:"xff"`
}

const vcl = `vcl 4.1;
# Misses are fetched through lower-tier node l2b (NetScaler's L2NS3).
backend l2b { .host = "10.77.0.4"; .port = "8601"; }
sub vcl_recv {
	# Readiness without touching the backend: a fetch from l2b before it
	# listens would be refused, and varnish then holds the backend down
	# (backend_remote_error_holddown) past the moment the test starts.
	if (req.url == "/_varnish_ready") { return (synth(200)); }
}
sub vcl_deliver {
	# What the cache saw, for the test to check.
	set resp.http.X-Cache-Seen-Client-IP = req.http.Client-IP;
	if (obj.hits > 0) { set resp.http.X-Cache = "HIT"; } else { set resp.http.X-Cache = "MISS"; }
}
`

func startNtier(t *testing.T) *ntier {
	t.Helper()
	if _, err := exec.LookPath("varnishd"); err != nil {
		t.Fatal("varnishd is needed (Debian package varnish; make test installs it)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed (make test installs it)")
	}
	root := e2e.Root(t)
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "upper": 2, "l2a": 3, "l2b": 4, "cache": 5, "origin": 6})
	tiers, err := srcports.Load(filepath.Join(root, "Caddyfile.examples", "ntier-tiers.json"))
	if err != nil {
		t.Fatal(err)
	}
	n := &ntier{tp: tp, tiers: tiers, origin: "http://10.77.0.6:80/_seen"}

	origin := tp.Start(t, "origin", "origin", e2e.Bin(t, "testpeer"), nil,
		"-listen", "10.77.0.6:80", "-name", "origin", "-cache-control", "max-age=300")
	origin.WaitFor(t, "origin", 10*time.Second, func() error { _, err := n.seen(); return err })

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "n.vcl"), []byte(vcl), 0o644)
	cache := tp.Start(t, "cache", "varnish", "varnishd", nil, "-F", "-j", "none", "-f", filepath.Join(dir, "n.vcl"),
		"-a", "10.77.0.5:6081", "-n", filepath.Join(dir, "varnish"), "-T", "127.0.0.1:0", "-s", "malloc,64m")
	client := tp.HTTPClient("client")
	cache.WaitFor(t, "varnish", 30*time.Second, func() error {
		resp, err := client.Get("http://10.77.0.5:6081/_varnish_ready")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})

	lower, err := os.ReadFile(filepath.Join(root, "Caddyfile.examples", "ntier-lower.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"l2a", "l2b"} {
		tp.StartCaddy(t, node, string(lower), root, []string{"NODE=" + node, "LOWER_IP=" + tp.IP(node),
			"UPPER_TIER=10.77.0.2/32", "CACHES=10.77.0.5:6081", "CACHE_PEERS=10.77.0.5", "ORIGIN=10.77.0.6:80"})
	}
	upper, err := os.ReadFile(filepath.Join(root, "Caddyfile.examples", "ntier-upper.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	tp.StartCaddy(t, "upper", string(upper), root, []string{"UPPER_LISTEN=10.77.0.2:8600", "UPPER_RETURN=10.77.0.2:8700",
		"L2A=10.77.0.3:8601", "L2B=10.77.0.4:8601", "L2A_RETURN=10.77.0.3:8701", "L2B_RETURN=10.77.0.4:8701"})
	return n
}

// curl runs curl in the client's namespace and parses the response.
func (n *ntier) curl(t *testing.T, args ...string) (*http.Response, string) {
	t.Helper()
	out, err := n.tp.Command("client", "curl", append([]string{"-si", "--max-time", "10"}, args...)...).Output()
	if err != nil {
		t.Fatalf("curl %v: %v\n%s", args, err, out)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
	if err != nil {
		t.Fatalf("curl %v: %v\n%s", args, err, out)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func (n *ntier) seen() ([]seen, error) {
	from := n.observer
	if from == "" {
		from = "client"
	}
	resp, err := n.tp.HTTPClient(from).Get(n.origin)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var s []seen
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

func (n *ntier) mustSeen(t *testing.T) []seen {
	t.Helper()
	s, err := n.seen()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkSource asserts an origin-side connection came from a lower-tier
// node, from a port inside that node's range and no other node's; it
// returns the node.
func (n *ntier) checkSource(t *testing.T, s seen) string {
	t.Helper()
	host, portS, _ := net.SplitHostPort(s.Remote)
	port, _ := strconv.Atoi(portS)
	node := map[string]string{n.tp.IP("l2a"): "l2a", n.tp.IP("l2b"): "l2b"}[host]
	if node == "" {
		t.Fatalf("origin saw %s %s from %s: not a lower-tier node", s.Path, s.ClientIP, s.Remote)
	}
	owner, ok := n.tiers.Owner(uint16(port))
	if !ok || owner.Name != node {
		t.Fatalf("origin saw %s from node %s port %d, which belongs to %v", s.Path, node, port, owner.Name)
	}
	return node
}

func TestNTierCacheRedirectionInNamespaces(t *testing.T) {
	n := startNtier(t)
	clientIP := n.tp.IP("client")

	t.Run("miss then hit", func(t *testing.T) {
		// Miss: varnish fetches from the origin through l2b; a forged
		// Client-IP from the client is not trusted anywhere.
		resp, _ := n.curl(t, "-H", "Client-IP: 6.6.6.6", "-H", "X-Forwarded-For: 6.6.6.6", "http://10.77.0.2:8600/img/logo.png")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "MISS" {
			t.Fatalf("first request: %s X-Cache=%q", resp.Status, resp.Header.Get("X-Cache"))
		}
		if got := resp.Header.Get("X-Cache-Seen-Client-IP"); got != clientIP {
			t.Errorf("cache saw Client-IP %q, want %s", got, clientIP)
		}
		var fetch []seen
		for _, s := range n.mustSeen(t) {
			if s.Path == "/img/logo.png" {
				fetch = append(fetch, s)
			}
		}
		if len(fetch) != 1 {
			t.Fatalf("origin saw the miss %d times", len(fetch))
		}
		if node := n.checkSource(t, fetch[0]); node != "l2b" {
			t.Errorf("miss fetched through %s, want l2b (varnish's backend)", node)
		}
		if fetch[0].ClientIP != clientIP || !strings.HasPrefix(fetch[0].XFF, clientIP+",") || strings.Contains(fetch[0].XFF, "6.6.6.6") {
			t.Errorf("origin saw Client-IP %q X-Forwarded-For %q on the miss", fetch[0].ClientIP, fetch[0].XFF)
		}
		// The forged header was counted by the node that replaced it.
		forged := 0.0
		for _, node := range []string{"l2a", "l2b"} {
			v, _ := n.tp.Metric(t, node, `caddy_edgesteer_cache_redirect_forged_client_ip_total{node="`+node+`"}`)
			forged += v
		}
		if forged != 1 {
			t.Errorf("forged_client_ip_total over both nodes = %v after one forged request, want 1", forged)
		}
		// Hits: four more requests, spread over both lower-tier nodes, all
		// answered by varnish; the origin sees nothing.
		before := len(n.mustSeen(t))
		nodes := map[string]bool{}
		for range 4 {
			resp, _ := n.curl(t, "http://10.77.0.2:8600/img/logo.png")
			if resp.Header.Get("X-Cache") != "HIT" || len(strings.Fields(resp.Header.Get("X-Varnish"))) != 2 {
				t.Fatalf("repeat: X-Cache=%q X-Varnish=%q", resp.Header.Get("X-Cache"), resp.Header.Get("X-Varnish"))
			}
			if got := resp.Header.Get("X-Cache-Seen-Client-IP"); got != clientIP {
				t.Errorf("cache saw Client-IP %q on a hit, want %s", got, clientIP)
			}
			path := strings.Fields(resp.Header.Get("X-Cache-Path"))
			if len(path) != 2 || path[1] != "cache" {
				t.Fatalf("X-Cache-Path %q", resp.Header.Get("X-Cache-Path"))
			}
			nodes[path[0]] = true
		}
		if !nodes["l2a"] || !nodes["l2b"] {
			t.Errorf("the upper tier used only %v", nodes)
		}
		if after := len(n.mustSeen(t)); after != before {
			t.Errorf("origin saw %d requests during hits", after-before)
		}
	})

	t.Run("bypass", func(t *testing.T) {
		before := len(n.mustSeen(t))
		for i := range 10 {
			args := []string{"-H", "Client-IP: 6.6.6.6", fmt.Sprintf("http://10.77.0.2:8600/api/item/%d", i)}
			if i%2 == 1 {
				args = append([]string{"-X", "POST", "-d", "x=1"}, args...)
			}
			resp, _ := n.curl(t, args...)
			if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "" || !strings.HasSuffix(resp.Header.Get("X-Cache-Path"), " bypass") {
				t.Fatalf("bypass %d: %s X-Cache=%q X-Cache-Path=%q", i, resp.Status, resp.Header.Get("X-Cache"), resp.Header.Get("X-Cache-Path"))
			}
		}
		got := n.mustSeen(t)[before:]
		if len(got) != 10 {
			t.Fatalf("origin saw %d of 10 bypass requests", len(got))
		}
		nodes := map[string]int{}
		for _, s := range got {
			nodes[n.checkSource(t, s)]++
			if s.ClientIP != clientIP || s.XFF != clientIP {
				t.Errorf("origin saw Client-IP %q X-Forwarded-For %q, want %s", s.ClientIP, s.XFF, clientIP)
			}
		}
		if nodes["l2a"] == 0 || nodes["l2b"] == 0 {
			t.Errorf("bypass requests reached the origin only through %v", nodes)
		}
	})

	// The admin view (read by the dashboard) gives each node's counters as
	// its metrics do, and its caches, up.
	t.Run("admin view", func(t *testing.T) {
		bypass := 0
		for _, node := range []string{"l2a", "l2b"} {
			resp, err := n.tp.HTTPClient(node).Get("http://127.0.0.1:2019/cache_redirect/")
			if err != nil {
				t.Fatal(err)
			}
			var views []cacheredirect.NodeView
			err = json.NewDecoder(resp.Body).Decode(&views)
			resp.Body.Close()
			if err != nil || len(views) != 1 || views[0].Node != node || len(views[0].Caches) == 0 || !views[0].Caches[0].Up {
				t.Fatalf("%s: /cache_redirect/ %+v, %v", node, views, err)
			}
			for _, path := range []string{"cache", "bypass", "miss", "fallback"} {
				m, _ := n.tp.Metric(t, node, fmt.Sprintf(`caddy_edgesteer_cache_redirect_requests_total{node="%s",path="%s"}`, node, path))
				if got := views[0].RequestsTotal[path]; float64(got) != m {
					t.Errorf("%s %s: view %d, metric %v", node, path, got, m)
				}
			}
			m, _ := n.tp.Metric(t, node, `caddy_edgesteer_cache_redirect_forged_client_ip_total{node="`+node+`"}`)
			if float64(views[0].ForgedClientIPTotal) != m {
				t.Errorf("%s forged: view %d, metric %v", node, views[0].ForgedClientIPTotal, m)
			}
			bypass += int(views[0].RequestsTotal["bypass"])
		}
		if bypass < 10 {
			t.Errorf("bypass requests over both nodes: %d, want at least 10", bypass)
		}
	})

	t.Run("routing by port", func(t *testing.T) {
		for _, node := range []string{"l2a", "l2b"} {
			r := n.tiers.Nodes[0].Ports
			if node == "l2b" {
				r = n.tiers.Nodes[1].Ports
			}
			for _, lo := range []int{int(r.Lo) + 100, int(r.Hi) - 300} {
				resp, body := n.curl(t, "--local-port", fmt.Sprintf("%d-%d", lo, lo+200), "http://10.77.0.2:8700/")
				f := strings.Fields(body)
				if resp.StatusCode != 200 || len(f) != 3 || f[0] != node {
					t.Fatalf("flow from ports %d-%d reached %q, want %s", lo, lo+200, body, node)
				}
				if p, _ := strconv.Atoi(f[2]); p < lo || p > lo+200 {
					t.Errorf("%s saw port %s, want the flow's own port in %d-%d", node, f[2], lo, lo+200)
				}
			}
		}
	})
}

// USIP: the lower-tier node connects to the origin from the client's own
// address (IP_TRANSPARENT) and a port of its range. The origin routes the
// client's address back through the node, and the node delivers those
// replies to its transparent socket (socket match + policy routing), as the
// module README describes.
func TestUSIPInNamespaces(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("nft is needed (Debian package nftables; make test installs it)")
	}
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "l2u": 3, "origin": 6})
	tp.Run(t, "origin", "ip", "route", "add", "10.77.0.10/32", "via", "10.77.0.3")
	tp.Run(t, "l2u", "nft", "add table ip usip; add chain ip usip pre { type filter hook prerouting priority mangle; }; "+
		"add rule ip usip pre socket transparent 1 meta mark set 1")
	tp.Run(t, "l2u", "ip", "rule", "add", "fwmark", "1", "lookup", "100")
	tp.Run(t, "l2u", "ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")

	origin := tp.Start(t, "origin", "origin", e2e.Bin(t, "testpeer"), nil, "-listen", "10.77.0.6:80", "-name", "origin")
	// Replies to the client's address go through l2u, so the test reads
	// the origin's record from l2u's own (non-transparent) address.
	n := &ntier{tp: tp, origin: "http://10.77.0.6:80/_seen", observer: "l2u"}
	origin.WaitFor(t, "origin", 10*time.Second, func() error { _, err := n.seen(); return err })
	tp.StartCaddy(t, "l2u", `http://:8601 {
	bind 10.77.0.3
	cache_redirect {
		node l2u
		caches 10.77.0.5:6081
		origin 10.77.0.6:80
		ports 30000-30999
		usip
		bypass_path /api/*
	}
}`, t.TempDir(), nil)
	for i := range 3 {
		resp, _ := n.curl(t, fmt.Sprintf("http://10.77.0.3:8601/api/%d", i))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	got := n.mustSeen(t)
	if len(got) != 3 {
		t.Fatalf("origin saw %d requests", len(got))
	}
	for _, s := range got {
		host, portS, _ := net.SplitHostPort(s.Remote)
		port, _ := strconv.Atoi(portS)
		if host != "10.77.0.10" || port < 30000 || port > 30999 {
			t.Errorf("origin saw the connection from %s, want the client's address 10.77.0.10 and a port in 30000-30999", s.Remote)
		}
	}
}
