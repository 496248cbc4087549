package ntier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

// origin is an address nobody has: the lower nodes take it on their
// loopback, as their transparent listener would, so only forwarding by next
// hop (no address rewritten) can bring a client's packets to them.
const origin = "203.0.113.80"

// origin6 is the IPv6 origin, as unowned.
const origin6 = "2001:db8:80::80"

// nsProber connects to a node's health address from the upper namespace.
type nsProber struct{ tp *e2e.Topology }

func (p nsProber) Probe(ctx context.Context, n Node) error {
	c, err := p.tp.Dialer("upper", nil)(ctx, "tcp", n.Health)
	if err == nil {
		c.Close()
	}
	return err
}

// listenPort is the lower nodes' transparent listener.
const listenPort = 3129

// lowerNode runs host's transparent listener (IP_TRANSPARENT, on
// listenPort) until stopped: it answers "host local remote" (its name, the
// connection's local and remote address).
func lowerNode(t *testing.T, tp *e2e.Topology, host string) (stop func()) {
	t.Helper()
	lc := net.ListenConfig{Control: srcports.TransparentControl}
	var ln net.Listener
	if err := tp.In(host, func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", listenPort)) // both families
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s %s\n", host, c.LocalAddr(), c.RemoteAddr())
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return func() { ln.Close() }
}

// fetch connects from the client namespace, from client address src, to
// the origin, and returns which lower node answered; it checks that the
// node saw the client's own address as remote and the origin as local.
func fetch(tp *e2e.Topology, src netip.Addr) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(netip.MustParseAddr(origin), 80)
	if src.Is6() {
		dst = netip.AddrPortFrom(netip.MustParseAddr(origin6), 80)
	}
	c, err := tp.Dialer("client", &net.TCPAddr{IP: src.AsSlice()})(ctx, "tcp", dst.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[1] != dst.String() || f[2] != c.LocalAddr().String() {
		return "", fmt.Errorf("the node saw %q; want local %s and remote %s", line, dst, c.LocalAddr())
	}
	return f[0], nil
}

func output(t *testing.T, tp *e2e.Topology, host, bin string, args ...string) string {
	t.Helper()
	out, err := tp.Command(host, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", bin, strings.Join(args, " "), host, err, out)
	}
	return string(out)
}

// tableHandle is the "# handle N" of `nft -a list table`'s first line.
func tableHandle(listing string) string {
	first, _, _ := strings.Cut(listing, "\n")
	_, h, _ := strings.Cut(first, "# handle ")
	return h
}

// routes runs `ip route show table N` and returns its routes ("" also when
// the table does not exist).
func routes(cmd *exec.Cmd) string {
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "FIB table does not exist") {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("%v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// nothingInstalled fails the test if the upper namespace holds anything of
// rs: the nftables table, an ip rule at its priority, a route in a node's
// table.
func nothingInstalled(t *testing.T, tp *e2e.Topology, rs RuleSet, when string) {
	t.Helper()
	if out := output(t, tp, "upper", "nft", "list", "tables"); strings.Contains(out, rs.Table) {
		t.Errorf("%s: nftables still has %s:\n%s", when, rs.Table, out)
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := output(t, tp, "upper", "ip", fam, "rule", "list", "pref", fmt.Sprint(rs.RulePriority)); strings.TrimSpace(out) != "" {
			t.Errorf("%s: ip %s rules left at priority %d:\n%s", when, fam, rs.RulePriority, out)
		}
		for _, r := range rs.Routes {
			if out := routes(tp.Command("upper", "ip", fam, "route", "show", "table", fmt.Sprint(r.Mark))); out != "" {
				t.Errorf("%s: ip %s routes left in table %d:\n%s", when, fam, r.Mark, out)
			}
		}
	}
}

// A client namespace, an upper tier that only forwards (the rules of this
// package, installed by NetlinkKernel) and two lower nodes that intercept
// for any address (TproxyRules), all on one link, as the seed's routed
// layer 3 layout; the lower nodes answer the client directly. Each client address reaches
// the node its bucket says, by next hop alone; the upper tier keeps no
// conntrack entry; a dead node's clients, and only they, move and come
// back; removal leaves nothing.
func TestKernelInNamespaces(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "upper": 1, "l2a": 2, "l2b": 3})
	tp.EnableIPv6(t)
	clients := append(tp.ForwardVia(t, "upper", "client", "203.0.113.0/24", 40),
		tp.ForwardVia6(t, "upper", "client", "2001:db8:80::/64", 16)...)
	// Each lower node intercepts port 80 for any address into its
	// transparent listener: TproxyRules, installed by NetlinkKernel.
	lowerRS, err := TproxyRules(TproxyConfig{Ports: []srcports.Range{{Lo: 80, Hi: 80}}, ListenPort: listenPort})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"l2a", "l2b"} {
		k := NetlinkKernel{NetNS: "/var/run/netns/" + tp.NS(h)}
		if err := k.Apply(lowerRS); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Remove(lowerRS) })
	}
	tproxyTable := output(t, tp, "l2a", "nft", "list", "table", "ip", DefaultTproxyTable)
	if want := "tcp dport 80 fib daddr type != local meta mark set 0x0000012c tproxy to :3129 counter"; !strings.Contains(tproxyTable, want) {
		t.Errorf("lower node's table lacks %q:\n%s", want, tproxyTable)
	}
	if out := output(t, tp, "l2a", "nft", "list", "table", "ip6", DefaultTproxyTable); !strings.Contains(out, "tcp dport 80 fib daddr type != local meta mark set 0x0000012c tproxy to :3129 counter") {
		t.Errorf("lower node's ip6 table:\n%s", out)
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := output(t, tp, "l2a", "ip", fam, "route", "show", "table", "300"); !strings.Contains(out, "local default dev lo") {
			t.Errorf("lower node's table 300 (ip %s): %s", fam, out)
		}
	}
	lowerNode(t, tp, "l2a")
	stopB := lowerNode(t, tp, "l2b")

	kernel := NetlinkKernel{NetNS: "/var/run/netns/" + tp.NS("upper")}
	cfg := Config{
		Nodes: []Node{
			{Name: "l2a", NextHop: netip.MustParseAddr(tp.IP("l2a")), NextHop6: netip.MustParseAddr(tp.IP6("l2a")), Health: fmt.Sprintf("%s:%d", tp.IP("l2a"), listenPort)},
			{Name: "l2b", NextHop: netip.MustParseAddr(tp.IP("l2b")), NextHop6: netip.MustParseAddr(tp.IP6("l2b")), Health: fmt.Sprintf("%s:%d", tp.IP("l2b"), listenPort)},
		},
		Ports:      []srcports.Range{{Lo: 80, Hi: 80}, {Lo: 8000, Hi: 8099}},
		Interfaces: []string{"eth0"},
	}
	c, err := New(cfg, kernel, nsProber{tp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs := rules(c.cfg, c.assignment())
	t.Cleanup(func() { kernel.Remove(rs) })
	if err := c.Apply(); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(); err != nil { // idempotent
		t.Fatal(err)
	}
	table := output(t, tp, "upper", "nft", "list", "table", "ip", DefaultTable)
	for _, want := range []string{`iifname "eth0" tcp dport 80 fib daddr type != local notrack meta mark set jhash ip saddr mod 256 seed 0x4e544952 map @buckets counter`,
		`iifname "eth0" tcp dport 8000-8099 fib daddr type != local notrack`, "elements = { 0 : 0x", " 255 : 0x"} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, table)
		}
	}
	if n := strings.Count(table, " : 0x"); n != DefaultBuckets {
		t.Errorf("the map holds %d buckets, want %d:\n%s", n, DefaultBuckets, table)
	}
	if table6 := output(t, tp, "upper", "nft", "list", "table", "ip6", DefaultTable); !strings.Contains(table6,
		`iifname "eth0" tcp dport 80 fib daddr type != local notrack meta mark set jhash ip6 saddr mod 256 seed 0x4e544952 map @buckets counter`) {
		t.Errorf("nft list table ip6:\n%s", table6)
	}
	for _, fam := range []string{"-4", "-6"} {
		ipRules := output(t, tp, "upper", "ip", fam, "rule", "list", "pref", "20000")
		if !strings.Contains(ipRules, "fwmark 0xc9 lookup 201") || !strings.Contains(ipRules, "fwmark 0xca lookup 202") || strings.Count(ipRules, "\n") != 2 {
			t.Errorf("ip %s rules at 20000:\n%s", fam, ipRules)
		}
	}
	if out := output(t, tp, "upper", "ip", "-6", "route", "show", "table", "202"); !strings.Contains(out, "default via "+tp.IP6("l2b")) {
		t.Errorf("ip -6 route table 202: %s", out)
	}

	served := func(when string) map[netip.Addr]string {
		got := map[netip.Addr]string{}
		for _, a := range clients {
			name, err := fetch(tp, a)
			if err != nil {
				t.Fatalf("%s: client %s: %v", when, a, err)
			}
			if want := c.NodeFor(a); name != want {
				t.Errorf("%s: client %s (bucket %d) served by %s, want %s", when, a, Bucket(a, DefaultSeed, DefaultBuckets), name, want)
			}
			got[a] = name
		}
		return got
	}
	before := served("all up")
	count := map[string]int{}
	for a, n := range before {
		count[n+map[bool]string{true: "/v6", false: "/v4"}[a.Is6()]]++
	}
	if count["l2a/v4"] == 0 || count["l2b/v4"] == 0 || count["l2a/v6"] == 0 || count["l2b/v6"] == 0 {
		t.Fatalf("the clients of a family all on one node: %v", count)
	}
	if again := served("again"); fmt.Sprint(again) != fmt.Sprint(before) {
		t.Errorf("a second connection moved clients:\n%v\n%v", before, again)
	}
	if ct, _ := tp.Command("upper", "conntrack", "-L", "-d", origin).CombinedOutput(); strings.Contains(string(ct), "dst="+origin) {
		t.Errorf("the upper tier tracked client flows:\n%s", ct)
	}
	if ct, _ := tp.Command("upper", "conntrack", "-L", "-f", "ipv6").CombinedOutput(); strings.Contains(string(ct), "dst="+origin6) {
		t.Errorf("the upper tier tracked IPv6 client flows:\n%s", ct)
	}
	t.Logf("all up: %v", count)

	// l2b dies: after fall (3) failed probes its clients are on l2a.
	stopB()
	for range 3 {
		if err := c.ProbeOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for a, name := range served("l2b down") {
		if name != "l2a" {
			t.Errorf("l2b down: client %s on %s", a, name)
		}
	}
	lowerNode(t, tp, "l2b")
	if err := c.ProbeOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if back := served("l2b back"); fmt.Sprint(back) != fmt.Sprint(before) {
		t.Errorf("after l2b returned the assignment differs:\n%v\n%v", before, back)
	}

	// A reload with a third node adds its rule and route; one without it
	// again takes them out, and the clients are where they were.
	three := cfg
	three.Nodes = append(slices.Clone(cfg.Nodes), Node{Name: "l2c", NextHop: netip.MustParseAddr("10.77.0.4"), NextHop6: netip.MustParseAddr("fd77::4"), Health: "10.77.0.4:3129"})
	if err := c.Reconfigure(three); err != nil {
		t.Fatal(err)
	}
	if out := output(t, tp, "upper", "ip", "rule", "list", "pref", "20000"); !strings.Contains(out, "fwmark 0xcb lookup 203") {
		t.Errorf("with l2c: ip rules\n%s", out)
	}
	if err := c.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if out := output(t, tp, "upper", "ip", "rule", "list", "pref", "20000"); strings.Count(out, "\n") != 2 || strings.Contains(out, "0xcb") {
		t.Errorf("l2c taken out again: ip rules\n%s", out)
	}
	if out := routes(tp.Command("upper", "ip", "route", "show", "table", "203")); out != "" {
		t.Errorf("l2c taken out again: table 203 holds %s", out)
	}
	// A reload that changes nothing leaves the table as it is (same handle).
	handle := output(t, tp, "upper", "nft", "-a", "list", "table", "ip", DefaultTable)
	if err := c.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if again := output(t, tp, "upper", "nft", "-a", "list", "table", "ip", DefaultTable); tableHandle(again) != tableHandle(handle) {
		t.Errorf("a reload with the same configuration replaced the table: %q, then %q", tableHandle(handle), tableHandle(again))
	}
	if back := served("after reloads"); fmt.Sprint(back) != fmt.Sprint(before) {
		t.Errorf("after the reloads the assignment differs:\n%v\n%v", before, back)
	}

	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	nothingInstalled(t, tp, rs, "after Remove")
	if _, err := fetch(tp, clients[0]); err == nil {
		t.Error("after Remove a client still reached a lower node")
	}

	// A node whose next hop is on no link of the upper tier: the error says
	// so, and the route already added for l2a is taken out again.
	far := cfg
	far.Nodes = []Node{cfg.Nodes[0], {Name: "l2c", NextHop: netip.MustParseAddr("192.0.2.99"), NextHop6: netip.MustParseAddr("fd77::4")}}
	cf, _ := New(far, kernel, nsProber{tp}, nil)
	if err := cf.Apply(); err == nil || !strings.Contains(err.Error(), `node "l2c"`) || !strings.Contains(err.Error(), "on no link") {
		t.Errorf("next hop on no link: %v", err)
	}
	nothingInstalled(t, tp, rules(cf.cfg, cf.assignment()), "after the failed install")
	// The same for an IPv6 next hop on no link, after both IPv4 routes went in.
	far.Nodes[1] = Node{Name: "l2c", NextHop: netip.MustParseAddr("10.77.0.4"), NextHop6: netip.MustParseAddr("2001:db8:99::1")}
	cf, _ = New(far, kernel, nsProber{tp}, nil)
	if err := cf.Apply(); err == nil || !strings.Contains(err.Error(), `node "l2c": IPv6 route via next hop 2001:db8:99::1`) || !strings.Contains(err.Error(), "on no link") {
		t.Errorf("IPv6 next hop on no link: %v", err)
	}
	nothingInstalled(t, tp, rules(cf.cfg, cf.assignment()), "after the failed IPv6 install")

	// The lower nodes' rules come out as completely.
	for _, h := range []string{"l2a", "l2b"} {
		if err := (NetlinkKernel{NetNS: "/var/run/netns/" + tp.NS(h)}).Remove(lowerRS); err != nil {
			t.Fatal(err)
		}
		if out := output(t, tp, h, "nft", "list", "ruleset") + output(t, tp, h, "ip", "rule", "list", "pref", "20001") +
			output(t, tp, h, "ip", "-6", "rule", "list", "pref", "20001"); strings.TrimSpace(out) != "" {
			t.Errorf("%s after removing its rules:\n%s", h, out)
		}
		if out := routes(tp.Command(h, "ip", "route", "show", "table", "300")) + routes(tp.Command(h, "ip", "-6", "route", "show", "table", "300")); out != "" {
			t.Errorf("%s: table 300 after removal: %s", h, out)
		}
	}
}

// Without CAP_NET_ADMIN (a child test process whose bounding set lacks it,
// in a namespace of its own) Apply fails with ErrNoNetAdmin and leaves
// nothing behind.
func TestKernelWithoutNetAdmin(t *testing.T) {
	const marker = "EDGESTEER_NTIER_NO_NET_ADMIN"
	cfg := Config{Nodes: []Node{{Name: "a", NextHop: netip.MustParseAddr("127.0.0.2")}}, Ports: []srcports.Range{{Lo: 80, Hi: 80}}}.WithDefaults()
	rs := rules(cfg, Assign([]string{"a"}, []bool{true}, cfg.Buckets))
	if os.Getenv(marker) != "" {
		err := NetlinkKernel{}.Apply(rs)
		if !errors.Is(err, ErrNoNetAdmin) || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
			t.Fatalf("Apply without CAP_NET_ADMIN: %v", err)
		}
		t.Logf("error: %v", err)
		return
	}
	ns := e2e.NewNamespace(t)
	cmd := exec.Command("ip", "netns", "exec", ns, "setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin",
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count", "1")
	cmd.Env = append(os.Environ(), marker+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child without CAP_NET_ADMIN: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"nft", "list", "ruleset"}, {"ip", "rule", "list", "pref", "20000"}} {
		got, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(got)) != "" {
			t.Errorf("%v after the refused install: %v\n%s", args, err, got)
		}
	}
	if got := routes(exec.Command("ip", "netns", "exec", ns, "ip", "route", "show", "table", "201")); got != "" {
		t.Errorf("routes in table 201 after the refused install: %s", got)
	}
}

// A kernel that refuses the tproxy expression (WithoutTproxy: the rule
// names an extension no kernel has, so the real kernel answers the batch
// as one without nft_tproxy does): Apply fails naming tproxy, and the
// ip rule and local route it added before the table are taken out again.
func TestKernelWithoutTproxy(t *testing.T) {
	ns := e2e.NewNamespace(t)
	rs, err := TproxyRules(TproxyConfig{Ports: []srcports.Range{{Lo: 80, Hi: 80}}, ListenPort: listenPort})
	if err != nil {
		t.Fatal(err)
	}
	k := NetlinkKernel{NetNS: "/var/run/netns/" + ns, WithoutTproxy: true}
	err = k.Apply(rs)
	if err == nil || !strings.Contains(err.Error(), "the kernel lacks an nftables feature") || !strings.Contains(err.Error(), "tproxy (nft_tproxy") {
		t.Fatalf("Apply on a kernel without tproxy: %v", err)
	}
	t.Logf("error: %v", err)
	in := func(args ...string) string {
		out, _ := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if got := in("nft", "list", "ruleset") + in("ip", "rule", "list", "pref", "20001"); got != "" {
		t.Errorf("left after the refused install:\n%s", got)
	}
	if got := routes(exec.Command("ip", "netns", "exec", ns, "ip", "route", "show", "table", "300")); got != "" {
		t.Errorf("table 300 after the refused install: %s", got)
	}
	// The same rules without the hook install: the refusal was the tproxy
	// expression's alone.
	k.WithoutTproxy = false
	if err := k.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if err := k.Remove(rs); err != nil {
		t.Fatal(err)
	}
}
