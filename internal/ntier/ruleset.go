package ntier

import (
	"net/netip"
	"slices"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// RuleSet is everything one tier installs in the kernel, as data. The upper
// tier's: the nftables table that marks intercepted packets by bucket, and
// a policy route per node. A lower node's (Tproxy set, see TproxyRules):
// the table that hands intercepted packets to the transparent listener,
// and the local route that delivers them. A Kernel turns it into rules.
type RuleSet struct {
	Table      string           // nftables table, in family ip and/or ip6
	IPv4, IPv6 bool             // the families intercepted
	Ports      []srcports.Range // intercepted TCP destination ports
	Interfaces []string         // empty: any
	Seed       uint32
	// Marks holds, for each bucket, the firewall mark of the node it goes to.
	Marks        []uint32
	Routes       []Route
	RulePriority int
	// Tproxy, if not 0, makes this a lower node's set: packets go to the
	// transparent listener on this port (Marks and Seed unused).
	Tproxy uint16
}

// Route sends packets with Mark by table Mark to NextHop (IPv4) and
// NextHop6 (IPv6); without next hops, to this host (a local default route
// on lo in each family of the rule set).
type Route struct {
	Node     string
	Mark     uint32 // also the routing table
	NextHop  netip.Addr
	NextHop6 netip.Addr
}

// rules returns the rule set for cfg (with defaults) and assignment (bucket
// → node index, from Assign).
func rules(cfg Config, assignment []int) RuleSet {
	rs := RuleSet{
		Table: cfg.Table, Ports: slices.Clone(cfg.Ports), Interfaces: slices.Clone(cfg.Interfaces),
		Seed: cfg.Seed, RulePriority: cfg.RulePriority, Marks: make([]uint32, len(assignment)),
	}
	rs.IPv4, rs.IPv6 = cfg.families()
	for i, n := range cfg.Nodes {
		rs.Routes = append(rs.Routes, Route{Node: n.Name, Mark: mark(cfg, i), NextHop: n.NextHop.Unmap(), NextHop6: n.NextHop6})
	}
	for b, i := range assignment {
		rs.Marks[b] = mark(cfg, i)
	}
	return rs
}

func mark(cfg Config, node int) uint32 { return uint32(cfg.TableBase + 1 + node) }

// Equal reports whether rs and o install the same rules.
func (rs RuleSet) Equal(o RuleSet) bool {
	return rs.Table == o.Table && rs.IPv4 == o.IPv4 && rs.IPv6 == o.IPv6 && rs.Seed == o.Seed && rs.RulePriority == o.RulePriority && rs.Tproxy == o.Tproxy &&
		slices.Equal(rs.Ports, o.Ports) && slices.Equal(rs.Interfaces, o.Interfaces) &&
		slices.Equal(rs.Marks, o.Marks) && slices.Equal(rs.Routes, o.Routes)
}
