package cacheredirect_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

// Why each node has an exclusive port range: every lower-tier node sends to the
// origin from one shared source address, and a router in front of the
// origin sends each reply back to the right node by its destination port
// alone. Namespaces: client, upper tier, nodes l2a and l2b (both with the
// shared address 10.77.9.1 on their loopback and `local_ip 10.77.9.1`), the
// origin, and a router that the origin routes the shared address through,
// configured by the script `caddy tier-routes` prints from the example tier
// map. A burst of bypass requests spread over both nodes must all complete:
// a reply delivered to the node that does not own its port would meet no
// socket there and be reset.
func TestSharedSourceAddressRoutedByPort(t *testing.T) {
	const shared = "10.77.9.1"
	root := e2e.Root(t)
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "upper": 2, "l2a": 3, "l2b": 4, "origin": 6, "router": 7})
	tierFile := filepath.Join(root, "Caddyfile.examples", "ntier-tiers.json")
	tiers, err := srcports.Load(tierFile)
	if err != nil {
		t.Fatal(err)
	}
	n := &ntier{tp: tp, tiers: tiers, origin: "http://10.77.0.6:80/_seen"}

	// The router: forwarding on, no ICMP redirects (they would teach the
	// origin to skip it), the script from the tier map.
	for _, kv := range []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0"} {
		tp.Run(t, "router", "sysctl", "-qw", kv)
	}
	script, err := e2e.CaddyCommand(t, "tier-routes", "--tier-map", tierFile, "--shared-ip", shared,
		"--via", "l2a="+tp.IP("l2a"), "--via", "l2b="+tp.IP("l2b")).Output()
	if err != nil {
		t.Fatalf("caddy tier-routes: %v\n%s", err, script)
	}
	scriptFile := filepath.Join(t.TempDir(), "router.sh")
	os.WriteFile(scriptFile, script, 0o755)
	tp.Run(t, "router", "sh", scriptFile)
	tp.Run(t, "router", "sh", scriptFile) // running it again replaces, not duplicates
	tp.Run(t, "origin", "sysctl", "-qw", "net.ipv4.conf.all.accept_redirects=0")
	tp.Run(t, "origin", "ip", "route", "add", shared+"/32", "via", tp.IP("router"))

	origin := tp.Start(t, "origin", "origin", e2e.Bin(t, "testpeer"), nil, "-listen", "10.77.0.6:80", "-name", "origin")
	origin.WaitFor(t, "origin", 10*time.Second, func() error { _, err := n.seen(); return err })

	lower, err := os.ReadFile(filepath.Join(root, "Caddyfile.examples", "ntier-lower.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"l2a", "l2b"} {
		tp.Run(t, node, "ip", "addr", "add", shared+"/32", "dev", "lo")
		env := []string{"NODE=" + node, "LOWER_IP=" + tp.IP(node), "SOURCE_IP=" + shared,
			"UPPER_TIER=10.77.0.2/32", "CACHES=10.77.0.5:6081", "CACHE_PEERS=10.77.0.5", "ORIGIN=10.77.0.6:80"}
		tp.StartCaddy(t, node, string(lower), root, env)
	}
	upper, err := os.ReadFile(filepath.Join(root, "Caddyfile.examples", "ntier-upper.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	tp.StartCaddy(t, "upper", string(upper), root, []string{"UPPER_LISTEN=10.77.0.2:8600", "UPPER_RETURN=10.77.0.2:8700",
		"L2A=10.77.0.3:8601", "L2B=10.77.0.4:8601", "L2A_RETURN=10.77.0.3:8701", "L2B_RETURN=10.77.0.4:8701"})

	// A burst of bypass requests, all at once.
	const requests = 24
	nodeOf := make([]string, requests)
	errs := make([]error, requests)
	e2e.Together(requests, func(i int) {
		out, err := tp.Command("client", "curl", "-si", "--max-time", "10", fmt.Sprintf("http://10.77.0.2:8600/api/shared/%d", i)).Output()
		if err != nil {
			errs[i] = fmt.Errorf("curl: %v\n%s", err, out)
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil || resp.StatusCode != 200 {
			errs[i] = fmt.Errorf("answer %v: %s", err, out)
			return
		}
		if f := strings.Fields(resp.Header.Get("X-Cache-Path")); len(f) == 2 && f[1] == "bypass" {
			nodeOf[i] = f[0]
		} else {
			errs[i] = fmt.Errorf("X-Cache-Path %q", resp.Header.Get("X-Cache-Path"))
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The origin saw every request from the shared address, from a port
	// of the range of the node that answered it.
	byPath := map[string]string{}
	for _, s := range n.mustSeen(t) {
		byPath[s.Path] = s.Remote
	}
	perNode := map[string]int{}
	for i, node := range nodeOf {
		remote, ok := byPath[fmt.Sprintf("/api/shared/%d", i)]
		if !ok {
			t.Fatalf("the origin did not see request %d", i)
		}
		host, portS, _ := strings.Cut(remote, ":")
		port, _ := strconv.Atoi(portS)
		owner, _ := tiers.Owner(uint16(port))
		if host != shared || owner.Name != node {
			t.Errorf("request %d through %s reached the origin from %s (port owner %q), want %s and a port of %s", i, node, remote, owner.Name, shared, node)
		}
		perNode[node]++
	}
	if perNode["l2a"] == 0 || perNode["l2b"] == 0 {
		t.Fatalf("the upper tier used only %v", perNode)
	}
	// The router steered replies to both nodes, by their rules.
	out, err := tp.Command("router", "nft", "list", "table", "ip", "edgesteer_tiers").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	for _, node := range []string{"l2a", "l2b"} {
		m := regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "` + node + `"`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("router rules:\n%s", out)
		}
		if p, _ := strconv.Atoi(string(m[1])); p == 0 {
			t.Errorf("the router's rule for %s steered no packet:\n%s", node, out)
		}
	}
}
