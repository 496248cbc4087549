package ntier_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ntier_ "github.com/edgesteer/edgesteer/caddymodules/ntier"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ntier"
)

// lowerGlobal makes a Caddy a lower node intercepting port 80 for its
// listener on 3129.
const lowerGlobal = `{
	ntier {
		lower {
			ports 80
			listen_port 3129
		}
	}
}
`

const lowerCaddyfile = lowerGlobal + `http://:3129 {
	bind tproxy/[::]
	handle /big.bin {
		file_server
	}
	handle {
		respond "{$NODE} {http.request.local} {http.request.remote.host}"
	}
}
`

// example reads a Caddyfile of Caddyfile.examples.
func example(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// upperEnv runs the upper example with the tier map in dir and probes fast
// enough for a test.
func upperEnv(dir string) []string {
	return []string{"TIER_MAP=" + filepath.Join(dir, "tiers.json"), "HEALTH_INTERVAL=500ms", "HEALTH_TIMEOUT=400ms"}
}

// clientFrom is an HTTP client in the client namespace whose connections
// (one per request) leave from src.
func clientFrom(tp *e2e.Topology, src netip.Addr, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: tp.Dialer("client", &net.TCPAddr{IP: src.AsSlice()}), DisableKeepAlives: true}}
}

// get fetches http://origin/ from the client namespace, from src, and
// returns the answering node; the node must have seen src and origin.
func get(tp *e2e.Topology, src netip.Addr, origin string) (string, error) {
	client := clientFrom(tp, src, 3*time.Second)
	dst := netip.AddrPortFrom(netip.MustParseAddr(origin), 80).String()
	resp, err := client.Get("http://" + dst + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	f := strings.Fields(string(body))
	if len(f) != 3 || f[1] != dst || f[2] != src.String() {
		return "", fmt.Errorf("answer %q: want the node, %s and %s", body, dst, src)
	}
	return f[0], nil
}

// originFor is the origin a client of a's family fetches.
func originFor(a netip.Addr) string {
	if a.Is6() {
		return "2001:db8:80::80"
	}
	return "203.0.113.80"
}

func run(t *testing.T, tp *e2e.Topology, host string, args ...string) string {
	t.Helper()
	out, err := tp.Command(host, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", args, host, err, out)
	}
	return string(out)
}

// The whole transparent tier through bin/caddy in namespaces: client →
// upper (the ntier app's kernel rules only) → two lower nodes (the ntier
// app's tproxy rules and a `bind tproxy/…` server) that answer the client
// directly. Each client lands on its documented node with its own address
// kept; no conntrack entry in the upper namespace; a killed node's clients
// move and only they; they come back when it returns; a forced reload of the
// upper keeps its table; stopping Caddy removes every rule on both tiers.
func TestTransparentTierEndToEnd(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "upper": 1, "l2a": 2, "l2b": 3})
	tp.EnableIPv6(t)
	clients := tp.ForwardVia(t, "upper", "client", "203.0.113.0/24", 24)
	clients6 := tp.ForwardVia6(t, "upper", "client", "2001:db8:80::/64", 8)
	names := []string{"l2a", "l2b"}
	documented := map[netip.Addr]string{}
	assign := ntier.Assign(names, []bool{true, true}, ntier.DefaultBuckets)
	perNode := map[string]int{}
	for _, a := range append(slices.Clone(clients), clients6...) {
		documented[a] = names[assign[ntier.Bucket(a, ntier.DefaultSeed, ntier.DefaultBuckets)]]
		perNode[fmt.Sprint(documented[a], " v", map[bool]int{true: 6, false: 4}[a.Is6()])]++
	}
	if len(perNode) != 4 {
		t.Fatalf("the clients of each family must cover both nodes: %v", perNode)
	}
	dir := t.TempDir()
	tiers := fmt.Sprintf(`{"nodes":[{"name":"l2a","next_hop":%q,"next_hop6":%q},{"name":"l2b","next_hop":%q,"next_hop6":%q}]}`,
		tp.IP("l2a"), tp.IP6("l2a"), tp.IP("l2b"), tp.IP6("l2b"))
	if err := os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(tiers), 0o644); err != nil {
		t.Fatal(err)
	}
	la := tp.StartCaddy(t, "l2a", lowerCaddyfile, dir, []string{"NODE=l2a"})
	lb := tp.StartCaddy(t, "l2b", lowerCaddyfile, dir, []string{"NODE=l2b"})
	upper := tp.StartCaddy(t, "upper", example(t, "ntier-transparent-upper.Caddyfile"), dir, upperEnv(dir))

	// round fetches once per client and returns who answered ("" failed).
	round := func() map[netip.Addr]string {
		got := map[netip.Addr]string{}
		for _, a := range append(slices.Clone(clients), clients6...) {
			node, err := get(tp, a, originFor(a))
			if err != nil {
				t.Logf("client %s: %v", a, err)
			}
			got[a] = node
		}
		return got
	}
	want := func(what string, expect func(a netip.Addr) string) {
		t.Helper()
		for a, node := range round() {
			if node != expect(a) {
				t.Errorf("%s: client %s on %q, want %q", what, a, node, expect(a))
			}
		}
	}
	want("all up", func(a netip.Addr) string { return documented[a] })
	if ct, _ := tp.Command("upper", "conntrack", "-L", "-d", "203.0.113.80").CombinedOutput(); strings.Contains(string(ct), "dst=203.0.113.80") {
		t.Errorf("the upper tier tracked client flows:\n%s", ct)
	}
	if ct, _ := tp.Command("upper", "conntrack", "-L", "-f", "ipv6").CombinedOutput(); strings.Contains(string(ct), "dst=2001:db8:80::80") {
		t.Errorf("the upper tier tracked IPv6 client flows:\n%s", ct)
	}
	if ss := run(t, tp, "upper", "ss", "-tan"); strings.Contains(ss, "203.0.113.80") || strings.Contains(ss, "2001:db8:80::80") || clientAddr.MatchString(ss) {
		t.Errorf("the upper tier holds TCP sockets of client flows:\n%s", ss)
	}
	replyBytes(t, tp, clients, dir)

	// l2b's Caddy is killed (its rules stay behind, its listener is gone):
	// its clients move to l2a once the upper's probes see it down; l2a's
	// clients never move. Its restart installs its rules over the leftovers.
	lb.Kill()
	moved := false
	for deadline := time.Now().Add(60 * time.Second); !moved && time.Now().Before(deadline); {
		moved = true
		for a, node := range round() {
			if documented[a] == "l2a" && node != "l2a" {
				t.Fatalf("l2b down: client %s of l2a answered by %q", a, node)
			}
			moved = moved && node == "l2a"
		}
	}
	if !moved {
		t.Fatal("l2b down: its clients did not move to l2a")
	}
	upper.WaitLog(t, "lower node down: its buckets move to the others", 10*time.Second)
	var v ntierView
	adminJSON(t, tp, "upper", &v)
	if u := v.Upper; u == nil || len(u.Nodes) != 2 || u.Nodes[1].Up || u.Nodes[1].Serving != 0 || u.Nodes[0].Serving != 256 || !u.Installed {
		t.Errorf("admin view with l2b down: %+v", v.Upper)
	}
	if up, ok := tp.Metric(t, "upper", `caddy_edgesteer_ntier_node_up{node="l2b"}`); !ok || up != 0 {
		t.Errorf("node_up{l2b} = %v (found %v), want 0", up, ok)
	}
	if n, ok := tp.Metric(t, "upper", `caddy_edgesteer_ntier_buckets{node="l2a"}`); !ok || n != 256 {
		t.Errorf("buckets{l2a} = %v (found %v), want 256", n, ok)
	}
	adminJSON(t, tp, "l2a", &v)
	if l := v.Lower; l == nil || l.ListenPort != 3129 || l.Mark != 300 || fmt.Sprint(l.Ports) != "[80-80]" || fmt.Sprint(l.IPVersions) != "[4 6]" || v.Upper != nil {
		t.Errorf("l2a's admin view: %+v", v)
	}
	lb = tp.StartCaddy(t, "l2b", lowerCaddyfile, dir, []string{"NODE=l2b"})
	back := false
	for deadline := time.Now().Add(60 * time.Second); !back && time.Now().Before(deadline); {
		back = true
		for a, node := range round() {
			back = back && node == documented[a]
		}
	}
	if !back {
		t.Fatal("l2b back: the documented assignment did not return")
	}

	// A forced reload of the upper with the same configuration keeps the
	// table (same handle) and the assignment.
	handle := tableHandle(run(t, tp, "upper", "nft", "-a", "list", "table", "ip", ntier.DefaultTable))
	path := filepath.Join(dir, "Caddyfile.upper")
	os.WriteFile(path, []byte(example(t, "ntier-transparent-upper.Caddyfile")), 0o644)
	reload := append(append([]string{"env", "--chdir=" + dir}, upperEnv(dir)...),
		e2e.Bin(t, "caddy"), "reload", "--force", "--adapter", "caddyfile", "--config", path, "--address", "127.0.0.1:2019")
	run(t, tp, "upper", reload...)
	if h := tableHandle(run(t, tp, "upper", "nft", "-a", "list", "table", "ip", ntier.DefaultTable)); h != handle || h == "" {
		t.Errorf("reload replaced the table: handle %q, then %q", handle, h)
	}
	want("after the reload", func(a netip.Addr) string { return documented[a] })

	// Stopping Caddy removes every rule it installed, on both tiers.
	for host, p := range map[string]*e2e.Proc{"upper": upper, "l2a": la, "l2b": lb} {
		if err := p.Stop(); err != nil {
			t.Logf("%s caddy: %v", host, err)
		}
	}
	if out := run(t, tp, "upper", "nft", "list", "tables"); strings.Contains(out, ntier.DefaultTable) {
		t.Errorf("upper stopped, its table stays:\n%s", out)
	}
	if out := run(t, tp, "upper", "ip", "rule", "list", "pref", "20000"); strings.TrimSpace(out) != "" {
		t.Errorf("upper stopped, its ip rules stay:\n%s", out)
	}
	if out := run(t, tp, "upper", "ip", "-6", "rule", "list", "pref", "20000"); strings.TrimSpace(out) != "" {
		t.Errorf("upper stopped, its IPv6 rules stay:\n%s", out)
	}
	for _, h := range []string{"l2a", "l2b"} {
		if out := run(t, tp, h, "nft", "list", "ruleset") + run(t, tp, h, "ip", "rule", "list", "pref", "20001") +
			run(t, tp, h, "ip", "-6", "rule", "list", "pref", "20001"); strings.TrimSpace(out) != "" {
			t.Errorf("%s stopped, its rules stay:\n%s", h, out)
		}
	}
}

type ntierView = ntier_.View

// adminJSON reads GET /ntier/ of the Caddy in host's namespace.
func adminJSON(t *testing.T, tp *e2e.Topology, host string, v any) {
	t.Helper()
	*v.(*ntierView) = ntierView{}
	resp, err := tp.HTTPClient(host).Get("http://127.0.0.1:2019/ntier/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// replyBytes has every client fetch a 1 MiB object and checks that the
// replies do not cross the upper tier: what the upper namespace received
// beyond what the clients sent (requests and ACKs are forwarded through it)
// is at most 1 % of what the clients received.
func replyBytes(t *testing.T, tp *e2e.Topology, clients []netip.Addr, dir string) {
	t.Helper()
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	os.WriteFile(filepath.Join(dir, "big.bin"), big, 0o644)
	counter := func(host, which string) int64 {
		var n int64
		fmt.Sscan(run(t, tp, host, "cat", "/sys/class/net/eth0/statistics/"+which), &n)
		return n
	}
	upperRx, clientTx, clientRx := counter("upper", "rx_bytes"), counter("client", "tx_bytes"), counter("client", "rx_bytes")
	for _, a := range clients {
		client := clientFrom(tp, a, 30*time.Second)
		resp, err := client.Get("http://203.0.113.80/big.bin")
		if err != nil {
			t.Fatalf("client %s: %v", a, err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != int64(len(big)) {
			t.Fatalf("client %s: %d bytes of %d", a, n, len(big))
		}
	}
	upperRx, clientTx, clientRx = counter("upper", "rx_bytes")-upperRx, counter("client", "tx_bytes")-clientTx, counter("client", "rx_bytes")-clientRx
	through := upperRx - clientTx
	t.Logf("%d MiB fetched: client received %d B, sent %d B; upper received %d B (%d B beyond the client's, %.3f %% of the replies)",
		len(clients), clientRx, clientTx, upperRx, through, 100*float64(through)/float64(clientRx))
	if float64(through) > 0.01*float64(clientRx) {
		t.Errorf("reply bytes through the upper tier: %d B, %.2f %% of the %d B the clients received (want <= 1 %%)",
			through, 100*float64(through)/float64(clientRx), clientRx)
	}
}

// clientAddr matches the client addresses ForwardVia adds (10.77.0.100 on).
var clientAddr = regexp.MustCompile(`10\.77\.0\.1\d\d\b|fd77::1:`)

// tableHandle is the "# handle N" of `nft -a list table`'s first line.
func tableHandle(listing string) string {
	first, _, _ := strings.Cut(listing, "\n")
	_, h, _ := strings.Cut(first, "# handle ")
	return h
}

// bin/caddy without CAP_NET_ADMIN (setpriv drops it from the bounding set)
// refuses to start the app, saying why, and leaves nothing installed.
func TestTransparentNeedsNetAdmin(t *testing.T) {
	ns := e2e.NewNamespace(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(`{"nodes":[{"name":"l2a","next_hop":"127.0.0.2"}]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(example(t, "ntier-transparent-upper.Caddyfile")), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin",
		"env", "--chdir="+dir, "HOME="+dir, "TIER_MAP=tiers.json", e2e.Bin(t, "caddy"), "run", "--adapter", "caddyfile", "--config", "Caddyfile")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("caddy without CAP_NET_ADMIN kept running:\n%s", out)
	}
	if err == nil || !strings.Contains(string(out), "ntier upper: transparent mode needs CAP_NET_ADMIN") {
		t.Fatalf("caddy without CAP_NET_ADMIN: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"nft", "list", "ruleset"}, {"ip", "rule", "list", "pref", "20000"}} {
		if got, _ := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput(); strings.TrimSpace(string(got)) != "" {
			t.Errorf("%v after the refused start:\n%s", args, got)
		}
	}
}

// bin/caddy as both tiers on a kernel that refuses the tproxy expression
// (the test hook EDGESTEER_TEST_KERNEL_WITHOUT_TPROXY: the real kernel
// refuses the lower rule's batch as one without nft_tproxy does) exits
// naming tproxy, and takes out the upper tier's rules it had installed
// first: nothing of either tier is left.
func TestTransparentKernelWithoutTproxy(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"node": 2})
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(`{"nodes":[{"name":"l2a","next_hop":"10.77.0.9"}]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(`{
	ntier {
		upper {
			tier_map tiers.json
			ports 80
		}
		lower {
			ports 80
			listen_port 3129
		}
	}
}
`), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", tp.NS("node"), "env", "--chdir="+dir, "HOME="+dir,
		"EDGESTEER_TEST_KERNEL_WITHOUT_TPROXY=1", e2e.Bin(t, "caddy"), "run", "--adapter", "caddyfile", "--config", "Caddyfile")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("caddy on a kernel without tproxy kept running:\n%s", out)
	}
	if err == nil || !regexp.MustCompile(`ntier lower: .*the kernel lacks an nftables feature .*tproxy`).Match(out) {
		t.Fatalf("caddy on a kernel without tproxy: %v\n%s", err, out)
	}
	left := run(t, tp, "node", "nft", "list", "ruleset") + run(t, tp, "node", "ip", "rule", "list", "pref", "20000") +
		run(t, tp, "node", "ip", "rule", "list", "pref", "20001")
	for _, table := range []string{"201", "300"} {
		if r, _ := tp.Command("node", "ip", "route", "show", "table", table).CombinedOutput(); !strings.Contains(string(r), "does not exist") {
			left += string(r)
		}
	}
	if strings.TrimSpace(left) != "" {
		t.Errorf("left after the refused start:\n%s", left)
	}
}
