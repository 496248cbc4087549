package ntier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// The seed's layout: four lower-tier devices L2NS1-L2NS4 behind the upper
// tier, which intercepts port 80.
func seedConfig() Config {
	return Config{
		Nodes: []Node{
			{Name: "L2NS1", NextHop: addr("10.0.2.1")}, {Name: "L2NS2", NextHop: addr("10.0.2.2")},
			{Name: "L2NS3", NextHop: addr("10.0.2.3")}, {Name: "L2NS4", NextHop: addr("10.0.2.4")},
		},
		Ports: []srcports.Range{{Lo: 80, Hi: 80}},
	}
}

var seedNames = []string{"L2NS1", "L2NS2", "L2NS3", "L2NS4"}

func TestAssign(t *testing.T) {
	const buckets = 256
	all := Assign(seedNames, []bool{true, true, true, true}, buckets)
	for b, n := range all {
		if n != b%4 {
			t.Fatalf("all up: bucket %d on node %d, want its documented node %d", b, n, b%4)
		}
	}
	cases := []struct {
		name string
		up   []bool
	}{
		{"L2NS2 down", []bool{true, false, true, true}},
		{"L2NS2 and L2NS3 down", []bool{true, false, false, true}},
		{"only L2NS4 up", []bool{false, false, false, true}},
	}
	prev := all
	for _, tc := range cases {
		got := Assign(seedNames, tc.up, buckets)
		moved := map[int]int{} // to node → buckets
		for b := range got {
			switch {
			case tc.up[prev[b]] && got[b] != prev[b]:
				t.Errorf("%s: bucket %d moved from live node %d to %d", tc.name, b, prev[b], got[b])
			case !tc.up[got[b]]:
				t.Errorf("%s: bucket %d on down node %d", tc.name, b, got[b])
			case got[b] != prev[b]:
				moved[got[b]]++
			}
		}
		live := 0
		for i, u := range tc.up {
			if u {
				live++
				if tc.name == "L2NS2 down" && moved[i] < 10 {
					t.Errorf("%s: node %d took %d of L2NS2's 64 buckets; want them spread (>= 10 each)", tc.name, i, moved[i])
				}
			}
		}
		prev = got
	}
	// Every node back: the documented assignment again.
	back := Assign(seedNames, []bool{true, true, true, true}, buckets)
	for b := range back {
		if back[b] != all[b] {
			t.Fatalf("after return: bucket %d on %d, want %d", b, back[b], all[b])
		}
	}
	// All down: the documented assignment stays.
	none := Assign(seedNames, make([]bool, 4), buckets)
	for b := range none {
		if none[b] != b%4 {
			t.Fatalf("all down: bucket %d on %d, want %d", b, none[b], b%4)
		}
	}
}

// Either upper-tier device of the seed (L1NS1, L1NS2) sends client A to the
// same lower device: the choice depends on the configuration and the
// client's address only, so the upper tier needs no shared session state.
func TestTwoUpperDevicesAgree(t *testing.T) {
	k1, k2 := newFakeKernel(), newFakeKernel()
	p := &fakeProber{}
	l1ns1, err := New(seedConfig(), k1, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	l1ns2, _ := New(seedConfig(), k2, p, nil)
	for _, c := range []*Controller{l1ns1, l1ns2} {
		if err := c.Apply(); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := k1.snapshot()[DefaultTable], k2.snapshot()[DefaultTable]; !a.Equal(b) || len(a.Marks) != DefaultBuckets {
		t.Fatalf("L1NS1 and L1NS2 install different rule sets:\n%+v\n%+v", a, b)
	}
	seen := map[string]int{}
	for i := range 200 {
		client := addr(fmt.Sprintf("192.0.2.%d", i))
		n1, n2 := l1ns1.NodeFor(client), l1ns2.NodeFor(client)
		if n1 != n2 {
			t.Fatalf("client %s: L1NS1 sends it to %s, L1NS2 to %s", client, n1, n2)
		}
		seen[n1]++
	}
	if len(seen) != 4 {
		t.Errorf("200 clients reached %v, want all four lower devices", seen)
	}
}

func TestHealthMovesOnlyTheDeadNodesClients(t *testing.T) {
	k, p := newFakeKernel(), &fakeProber{}
	c, err := New(seedConfig(), k, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(); err != nil {
		t.Fatal(err)
	}
	clients := make([]string, 300)
	before := map[string]string{}
	for i := range clients {
		clients[i] = fmt.Sprintf("198.51.%d.%d", i/200, i%200)
		before[clients[i]] = c.NodeFor(addr(clients[i]))
	}
	ctx := context.Background()
	var changes []string
	c.OnChange(func(node string, up bool, lastErr string) {
		changes = append(changes, fmt.Sprint(node, " ", up, " ", lastErr))
	})
	p.set("L2NS2", true)
	for i := range 2 { // fall is 3: two failures keep it up
		if err := c.ProbeOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if c.NodeFor(addr(clients[0])) != before[clients[0]] || k.applies != 1 {
			t.Fatalf("after %d failed probes: rules re-applied (%d applies)", i+1, k.applies)
		}
	}
	c.ProbeOnce(ctx)
	if k.applies != 2 {
		t.Fatalf("third failure: %d applies, want 2 (the node went down)", k.applies)
	}
	installed := k.snapshot()[DefaultTable]
	for _, cl := range clients {
		now := c.NodeFor(addr(cl))
		b := Bucket(addr(cl), DefaultSeed, DefaultBuckets)
		if int(installed.Marks[b]) != DefaultTableBase+1+indexOf(now) {
			t.Fatalf("client %s: NodeFor says %s, the installed map says mark %d", cl, now, installed.Marks[b])
		}
		switch {
		case before[cl] == "L2NS2" && now == "L2NS2":
			t.Fatalf("client %s still on the dead node", cl)
		case before[cl] != "L2NS2" && now != before[cl]:
			t.Fatalf("client %s of live %s moved to %s", cl, before[cl], now)
		}
	}
	if v := c.View(); v.Nodes[1].Up || v.Nodes[1].Serving != 0 || v.Nodes[1].Documented != 64 || v.Nodes[1].LastError == "" {
		t.Errorf("view of the dead node: %+v", v.Nodes[1])
	}
	p.set("L2NS2", false)
	c.ProbeOnce(ctx) // rise is 1
	if want := []string{"L2NS2 false connection refused", "L2NS2 true "}; fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Errorf("state changes heard: %q, want %q", changes, want)
	}
	for _, cl := range clients {
		if now := c.NodeFor(addr(cl)); now != before[cl] {
			t.Fatalf("after L2NS2 returned: client %s on %s, want its documented %s", cl, now, before[cl])
		}
	}
	if !k.snapshot()[DefaultTable].Equal(rules(c.cfg, Assign(seedNames, []bool{true, true, true, true}, DefaultBuckets))) {
		t.Fatal("after return: the installed rule set is not the documented one")
	}
}

func indexOf(name string) int {
	for i, n := range seedNames {
		if n == name {
			return i
		}
	}
	return -1
}

// A reload with the same configuration changes nothing in the kernel; one
// that changes the table name takes the old table out first. A failed
// Apply leaves the kernel as it was and is retried by the next probe.
func TestReloadAndFailures(t *testing.T) {
	k, p := newFakeKernel(), &fakeProber{}
	c, _ := New(seedConfig(), k, p, nil)
	if err := c.Apply(); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconfigure(seedConfig()); err != nil || k.applies != 1 || k.removes != 0 {
		t.Fatalf("same config reloaded: err %v, %d applies, %d removes; want no kernel call", err, k.applies, k.removes)
	}
	bad := seedConfig()
	bad.Nodes = append(bad.Nodes, Node{Name: "L2NS5"})
	if err := c.Reconfigure(bad); err == nil || k.applies != 1 {
		t.Fatalf("reload with a node without next hop: err %v, %d applies", err, k.applies)
	}
	renamed := seedConfig()
	renamed.Table = "other"
	if err := c.Reconfigure(renamed); err != nil {
		t.Fatal(err)
	}
	if tabs := k.snapshot(); len(tabs) != 1 || tabs["other"].Table != "other" {
		t.Fatalf("after renaming the table the kernel holds %d tables (other: %q)", len(tabs), tabs["other"].Table)
	}
	k.failApply = errors.New("netlink: operation not permitted")
	p.set("L2NS1", true)
	for range 3 {
		c.ProbeOnce(context.Background())
	}
	if err := c.ProbeOnce(context.Background()); err == nil || !strings.Contains(c.View().Error, "not permitted") {
		t.Fatalf("apply failing: ProbeOnce %v, view error %q", err, c.View().Error)
	}
	if !k.snapshot()["other"].Equal(rules(c.cfg, Assign(seedNames, []bool{true, true, true, true}, DefaultBuckets))) {
		t.Fatal("a failed apply changed the kernel")
	}
	k.failApply = nil
	if err := c.ProbeOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := k.snapshot()["other"].Marks; got[0] == uint32(DefaultTableBase+1) {
		t.Fatal("retry after the failure did not move L2NS1's buckets")
	}
	if err := c.Remove(); err != nil || len(k.snapshot()) != 0 {
		t.Fatalf("remove: %v, left %v", err, k.snapshot())
	}
	if err := c.Remove(); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	// Stopped while an apply was failing: no later probe installs anything.
	k.failApply = errors.New("netlink: operation not permitted")
	c.Apply()
	c.Remove()
	k.failApply = nil
	p.set("L2NS1", false)
	c.ProbeOnce(context.Background())
	if len(k.snapshot()) != 0 {
		t.Fatal("a probe after Remove installed the rules again")
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"overlapping ports", func(c *Config) { c.Ports = []srcports.Range{{Lo: 80, Hi: 90}, {Lo: 8000, Hi: 8080}, {Lo: 85, Hi: 85}} }, "ports: 80-90 and 85-85 overlap"},
		{"no ports", func(c *Config) { c.Ports = nil }, "ports: 0 ranges"},
		{"no next hop", func(c *Config) { c.Nodes[3].NextHop = Node{}.NextHop }, `node "L2NS4": no next_hop`},
		{"IPv6 in next_hop", func(c *Config) { c.Nodes[0].NextHop = addr("2001:db8::1") }, `node "L2NS1": next_hop 2001:db8::1: not an IPv4 address`},
		{"IPv4 in next_hop6", func(c *Config) { c.Nodes[0].NextHop6 = addr("10.0.9.1") }, `node "L2NS1": next_hop6 10.0.9.1: not an IPv6 address`},
		{"mapped next_hop6", func(c *Config) { c.Nodes[0].NextHop6 = addr("::ffff:10.0.9.1") }, "not an IPv6 address"},
		{"one node without IPv6", func(c *Config) {
			for i := 1; i < len(c.Nodes); i++ {
				c.Nodes[i].NextHop6 = addr(fmt.Sprintf("2001:db8::%d", i))
			}
		}, `node "L2NS1": no IPv6 next_hop6, while other nodes have one`},
		{"one node IPv6 only", func(c *Config) { c.Nodes[2].NextHop, c.Nodes[2].NextHop6 = Node{}.NextHop, addr("2001:db8::3") }, `node "L2NS1": no IPv6 next_hop6`},
		{"all dual-stack", func(c *Config) {
			for i := range c.Nodes {
				c.Nodes[i].NextHop6 = addr(fmt.Sprintf("2001:db8::%d", i))
			}
		}, ""},
		{"all IPv6 only", func(c *Config) {
			for i := range c.Nodes {
				c.Nodes[i].NextHop, c.Nodes[i].NextHop6 = Node{}.NextHop, addr(fmt.Sprintf("2001:db8::%d", i))
			}
		}, ""},
		{"same next_hop6", func(c *Config) {
			for i := range c.Nodes {
				c.Nodes[i].NextHop6 = addr(fmt.Sprintf("2001:db8::%d", i%2))
			}
		}, `node "L2NS3": next_hop 2001:db8:: is also node "L2NS1"'s`},
		{"same next hop", func(c *Config) { c.Nodes[1].NextHop = addr("10.0.2.1") }, `next_hop 10.0.2.1 is also node "L2NS1"'s`},
		{"duplicate name", func(c *Config) { c.Nodes[1].Name = "L2NS1" }, `node "L2NS1" listed twice`},
		{"no nodes", func(c *Config) { c.Nodes = nil }, "nodes: 0 given"},
		{"bad health", func(c *Config) { c.Nodes[0].Health = "10.0.2.1" }, `health "10.0.2.1"`},
		{"too few buckets", func(c *Config) { c.Buckets = 3 }, "buckets 3"},
		{"tables on main", func(c *Config) { c.TableBase = 250 }, "table_base 250"},
		{"priority after main", func(c *Config) { c.RulePriority = 32766 }, "rule_priority 32766"},
		{"long interface", func(c *Config) { c.Interfaces = []string{"a-very-long-interface"} }, "interfaces"},
	}
	for _, tc := range cases {
		cfg := seedConfig()
		tc.edit(&cfg)
		_, err := New(cfg, newFakeKernel(), &fakeProber{}, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// Buckets as the kernel computes them: TestKernelInNamespaces checks that
// real traffic lands where Bucket says; these pin the function itself for
// hosts where that test cannot run.
func TestBucket(t *testing.T) {
	for _, tc := range []struct {
		addr           string
		seeded, seed1k int
	}{
		{"10.77.0.100", 3, 336}, {"10.77.0.101", 207, 40}, {"192.0.2.1", 235, 856},
		{"198.51.100.7", 11, 312}, {"0.0.0.0", 44, 850}, {"255.255.255.255", 98, 471},
		{"::ffff:192.0.2.1", 235, 856},
		// IPv6 (jhash ip6 saddr: 16 bytes, one mixed block and a tail),
		// checked against the kernel by TestKernelInNamespaces' IPv6 clients.
		{"2001:db8::1", 107, 118}, {"fd77::1:0", 147, 236}, {"::", 175, 161},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 36, 694},
	} {
		if got := Bucket(addr(tc.addr), DefaultSeed, 256); got != tc.seeded {
			t.Errorf("Bucket(%s, default seed, 256) = %d, want %d", tc.addr, got, tc.seeded)
		}
		if got := Bucket(addr(tc.addr), 1, 1000); got != tc.seed1k {
			t.Errorf("Bucket(%s, 1, 1000) = %d, want %d", tc.addr, got, tc.seed1k)
		}
	}
	if got := Bucket(netip.Addr{}, DefaultSeed, 256); got != -1 {
		t.Errorf("Bucket(invalid) = %d, want -1", got)
	}
}

func TestTproxyRules(t *testing.T) {
	ports := []srcports.Range{{Lo: 80, Hi: 80}, {Lo: 8000, Hi: 8099}}
	rs, err := TproxyRules(TproxyConfig{Ports: ports, ListenPort: 3129})
	if err != nil {
		t.Fatal(err)
	}
	want := RuleSet{Table: DefaultTproxyTable, IPv4: true, IPv6: true, Ports: ports, RulePriority: DefaultTproxyPriority, Tproxy: 3129,
		Routes: []Route{{Node: "local", Mark: DefaultTproxyMark}}}
	if !rs.Equal(want) {
		t.Errorf("rule set %+v, want %+v", rs, want)
	}
	if rs, err := TproxyRules(TproxyConfig{Ports: ports, ListenPort: 3129, IPVersions: []int{6}}); err != nil || rs.IPv4 || !rs.IPv6 {
		t.Errorf("ip_versions 6: %+v, %v", rs, err)
	}
	for _, tc := range []struct {
		cfg  TproxyConfig
		want string
	}{
		{TproxyConfig{Ports: []srcports.Range{{Lo: 80, Hi: 90}, {Lo: 90, Hi: 95}}, ListenPort: 3129}, "ports: 80-90 and 90-95 overlap"},
		{TproxyConfig{Ports: ports}, "listen port 0"},
		{TproxyConfig{Ports: ports, ListenPort: 3129, Mark: 254}, "mark 254"},
		{TproxyConfig{Ports: ports, ListenPort: 3129, RulePriority: 40000}, "rule_priority 40000"},
		{TproxyConfig{Ports: ports, ListenPort: 3129, Interfaces: []string{""}}, "interfaces"},
		{TproxyConfig{Ports: ports, ListenPort: 3129, IPVersions: []int{4, 5}}, "ip_versions [4 5]"},
		{TproxyConfig{Ports: ports, ListenPort: 3129, IPVersions: []int{6, 6}}, "ip_versions [6 6]"},
	} {
		if _, err := TproxyRules(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// A reload whose rules cannot be installed leaves the controller on the
// old configuration, as Caddy keeps the old generation.
func TestFailedReloadKeepsTheOldConfig(t *testing.T) {
	k, p := newFakeKernel(), &fakeProber{}
	c, _ := New(seedConfig(), k, p, nil)
	if err := c.Apply(); err != nil {
		t.Fatal(err)
	}
	more := seedConfig()
	more.Buckets = 512
	k.failApply = errors.New("netlink: no buffer space")
	if err := c.Reconfigure(more); err == nil {
		t.Fatal("reload with a failing kernel: no error")
	}
	if v := c.View(); v.Buckets != DefaultBuckets {
		t.Fatalf("after the failed reload the controller has %d buckets, want the old %d", v.Buckets, DefaultBuckets)
	}
	k.failApply = nil
	c.ProbeOnce(context.Background())
	if got := len(k.snapshot()[DefaultTable].Marks); got != DefaultBuckets {
		t.Fatalf("a probe after the failed reload installed %d buckets", got)
	}
}
