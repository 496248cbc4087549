package ntier

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// Defaults of Config and Health.
const (
	DefaultBuckets      = 256
	DefaultSeed         = 0x4e544952 // "NTIR"; nftables picks a random seed when given none
	DefaultTableBase    = 200        // node i: mark and routing table base+1+i (tier-routes uses 100)
	DefaultRulePriority = 20000      // the ip rules' priority, before main (32766)
	DefaultTable        = "edgesteer_ntier"
	MaxBuckets          = 4096
	MaxNodes            = 64
	MaxPorts            = 64
	MaxInterfaces       = 16
)

// Node is one lower-tier node as the upper tier sees it.
type Node struct {
	Name string
	// NextHop and NextHop6 are the node's IPv4 and IPv6 addresses on a link
	// of the upper tier: intercepted packets are routed to them unchanged.
	// A node gives one or both; a family is intercepted when the nodes have
	// next hops of it, and then every node must have one.
	NextHop  netip.Addr
	NextHop6 netip.Addr
	// Health is the host:port a TCP connect checks; empty: NextHop:80 (or
	// [NextHop6]:80).
	Health string
}

// hop returns n's first next hop (IPv4 before IPv6).
func (n Node) hop() netip.Addr {
	if n.NextHop.IsValid() {
		return n.NextHop
	}
	return n.NextHop6
}

// Config is what the upper tier intercepts and where it sends it.
type Config struct {
	Nodes []Node
	// Ports are the intercepted TCP destination ports, for any destination
	// address that is not the upper tier's own.
	Ports []srcports.Range
	// Interfaces, if given, limit interception to packets arriving on them.
	Interfaces []string
	Buckets    int    // hash buckets of client addresses (DefaultBuckets)
	Seed       uint32 // the jhash seed (DefaultSeed); never 0
	// TableBase: node i uses firewall mark and routing table TableBase+1+i.
	TableBase    int
	RulePriority int    // priority of the ip rules; every rule at it is ours
	Table        string // the nftables table (family ip)
	Health       Health
}

// Health is how nodes are checked: a node goes down after Fall failed
// probes in a row and up again after Rise good ones. Defaults are
// NetScaler's monitor's: every 5 s, 2 s to answer, down after 3 failures,
// up after 1 success.
type Health struct {
	Interval time.Duration
	Timeout  time.Duration
	Fall     int
	Rise     int
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Buckets, DefaultBuckets)
	def(&c.TableBase, DefaultTableBase)
	def(&c.RulePriority, DefaultRulePriority)
	def(&c.Health.Fall, 3)
	def(&c.Health.Rise, 1)
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Health.Interval == 0 {
		c.Health.Interval = 5 * time.Second
	}
	if c.Health.Timeout == 0 {
		c.Health.Timeout = 2 * time.Second
	}
	c.Nodes = slices.Clone(c.Nodes)
	for i, n := range c.Nodes {
		if n.Health == "" && n.hop().IsValid() {
			c.Nodes[i].Health = netip.AddrPortFrom(n.hop().Unmap(), 80).String()
		}
	}
	return c
}

// Validate checks c (after defaults), naming the option and the bad value.
func (c Config) Validate() error {
	if len(c.Nodes) == 0 || len(c.Nodes) > MaxNodes {
		return fmt.Errorf("nodes: %d given, want 1 to %d", len(c.Nodes), MaxNodes)
	}
	names, hops := map[string]bool{}, map[netip.Addr]string{}
	for _, n := range c.Nodes {
		switch {
		case n.Name == "":
			return errors.New("nodes: a node has no name")
		case names[n.Name]:
			return fmt.Errorf("nodes: node %q listed twice", n.Name)
		case !n.hop().IsValid():
			return fmt.Errorf("node %q: no next_hop (the address the upper tier routes its clients' packets to)", n.Name)
		case n.NextHop.IsValid() && !n.NextHop.Unmap().Is4():
			return fmt.Errorf("node %q: next_hop %s: not an IPv4 address (give an IPv6 next hop as next_hop6)", n.Name, n.NextHop)
		case n.NextHop6.IsValid() && (!n.NextHop6.Is6() || n.NextHop6.Is4In6()):
			return fmt.Errorf("node %q: next_hop6 %s: not an IPv6 address", n.Name, n.NextHop6)
		}
		for _, h := range []netip.Addr{n.NextHop.Unmap(), n.NextHop6} {
			if other := hops[h]; h.IsValid() && other != "" {
				return fmt.Errorf("node %q: next_hop %s is also node %q's", n.Name, h, other)
			}
			hops[h] = n.Name
		}
		names[n.Name] = true
		if _, _, err := net.SplitHostPort(n.Health); err != nil {
			return fmt.Errorf("node %q: health %q: want host:port", n.Name, n.Health)
		}
	}
	if err := c.checkFamilies(); err != nil {
		return err
	}
	if err := checkPorts(c.Ports); err != nil {
		return err
	}
	if err := checkInterfaces(c.Interfaces); err != nil {
		return err
	}
	if c.Buckets < len(c.Nodes) || c.Buckets > MaxBuckets {
		return fmt.Errorf("buckets %d: want from the %d nodes to %d", c.Buckets, len(c.Nodes), MaxBuckets)
	}
	if c.Seed == 0 {
		return errors.New("seed 0: the kernel would pick a random one")
	}
	last := c.TableBase + len(c.Nodes)
	if c.TableBase < 1 || last >= 1<<31 || (c.TableBase < 255 && last >= 253) {
		return fmt.Errorf("table_base %d: tables %d-%d must avoid 253-255 (default, main, local) and fit 31 bits",
			c.TableBase, c.TableBase+1, last)
	}
	if c.RulePriority < 1 || c.RulePriority >= 32766 {
		return fmt.Errorf("rule_priority %d: want 1 to 32765 (before the main table's rule)", c.RulePriority)
	}
	if c.Table == "" || len(c.Table) > 255 {
		return fmt.Errorf("table %q: not an nftables table name", c.Table)
	}
	h := c.Health
	if h.Interval <= 0 || h.Timeout <= 0 || h.Timeout > h.Interval || h.Fall < 1 || h.Rise < 1 {
		return fmt.Errorf("health: interval %s, timeout %s, fall %d, rise %d: want timeout <= interval and fall, rise >= 1",
			h.Interval, h.Timeout, h.Fall, h.Rise)
	}
	return nil
}

// families reports which address families the nodes have next hops of:
// those the upper tier intercepts.
func (c Config) families() (v4, v6 bool) {
	for _, n := range c.Nodes {
		v4, v6 = v4 || n.NextHop.IsValid(), v6 || n.NextHop6.IsValid()
	}
	return v4, v6
}

// checkFamilies wants every node to have a next hop of each family any
// node has: the hash sends a client of that family to any node, and a node
// without one would have nowhere to route it.
func (c Config) checkFamilies() error {
	v4, v6 := c.families()
	for _, n := range c.Nodes {
		switch {
		case v4 && !n.NextHop.IsValid():
			return fmt.Errorf("node %q: no IPv4 next_hop, while other nodes have one: IPv4 clients hashed to it would have nowhere to go", n.Name)
		case v6 && !n.NextHop6.IsValid():
			return fmt.Errorf("node %q: no IPv6 next_hop6, while other nodes have one: IPv6 clients hashed to it would have nowhere to go", n.Name)
		}
	}
	return nil
}

// checkPorts wants 1 to MaxPorts ranges, none overlapping another.
func checkPorts(ports []srcports.Range) error {
	if len(ports) == 0 || len(ports) > MaxPorts {
		return fmt.Errorf("ports: %d ranges given, want 1 to %d", len(ports), MaxPorts)
	}
	sorted := slices.Clone(ports)
	slices.SortFunc(sorted, func(a, b srcports.Range) int { return int(a.Lo) - int(b.Lo) })
	for i, r := range sorted {
		if r.Lo == 0 || r.Hi < r.Lo {
			return fmt.Errorf("ports: %s is not a range of ports", r)
		}
		if i > 0 && r.Lo <= sorted[i-1].Hi {
			return fmt.Errorf("ports: %s and %s overlap", sorted[i-1], r)
		}
	}
	return nil
}

func checkInterfaces(ifaces []string) error {
	if len(ifaces) > MaxInterfaces {
		return fmt.Errorf("interfaces: %d given, at most %d", len(ifaces), MaxInterfaces)
	}
	for _, i := range ifaces {
		if i == "" || len(i) > 15 {
			return fmt.Errorf("interfaces: %q is not an interface name", i)
		}
	}
	return nil
}
