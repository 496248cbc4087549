package ntier

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNoNetAdmin is returned when the process may not change the network
// configuration.
var ErrNoNetAdmin = errors.New("transparent mode needs CAP_NET_ADMIN (run as root or grant the capability)")

// NetlinkKernel installs rule sets through netlink: the nftables table with
// google/nftables, the policy routes with vishvananda/netlink. NetNS is
// the path of the network namespace to work in (empty: the process's).
//
// Kernel support is detected by the kernel's answer to the install itself:
// the batch that creates the table carries every expression the rules use
// (hash, fib, notrack; tproxy on a lower node), the kernel loads the module
// of each (nft_tproxy, nf_tproxy_ipv4/ipv6, …) on demand, and refuses the
// whole batch with ENOENT (unknown expression type) or EOPNOTSUPP when it
// cannot. The batch commits nothing then, and Apply removes the routes and
// ip rules it added before it, so a refused first install leaves nothing.
type NetlinkKernel struct {
	NetNS string
	// WithoutTproxy is a test hook: the lower node's rule names, in place of
	// the tproxy expression, a kernel extension that no kernel has, so the
	// real kernel refuses the batch exactly as one without nft_tproxy does
	// (ENOENT after its module autoload fails).
	WithoutTproxy bool
}

const bucketMap = "buckets"

// family is what differs between IPv4 and IPv6 in the rules: the nftables
// table family, the routing family, where the source address lies in the
// network header, and the default route's prefix.
type family struct {
	name        string
	nf          nftables.TableFamily
	af          int
	saddr, alen uint32
	anyDst      *net.IPNet
	hop         func(Route) netip.Addr
}

var (
	ipv4 = family{"IPv4", nftables.TableFamilyIPv4, unix.AF_INET, 12, 4,
		&net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, func(r Route) netip.Addr { return r.NextHop }}
	ipv6 = family{"IPv6", nftables.TableFamilyIPv6, unix.AF_INET6, 8, 16,
		&net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, func(r Route) netip.Addr { return r.NextHop6 }}
	allFamilies = []family{ipv4, ipv6}
)

// wants reports whether rs installs rules of family f.
func (rs RuleSet) wants(f family) bool {
	return f.af == unix.AF_INET && rs.IPv4 || f.af == unix.AF_INET6 && rs.IPv6
}

// handles opens netlink sockets in k's namespace.
func (k NetlinkKernel) handles() (*nftables.Conn, *netlink.Handle, func(), error) {
	if err := checkNetAdmin(); err != nil {
		return nil, nil, nil, err
	}
	if k.NetNS == "" {
		nft, err := nftables.New()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("nftables: %w", err)
		}
		nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("rtnetlink: %w", err)
		}
		return nft, nl, nl.Close, nil
	}
	ns, err := netns.GetFromPath(k.NetNS)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("network namespace %s: %w", k.NetNS, err)
	}
	nft, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err == nil {
		var nl *netlink.Handle
		if nl, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE); err == nil {
			return nft, nl, func() { nl.Close(); ns.Close() }, nil
		}
	}
	ns.Close()
	return nil, nil, nil, fmt.Errorf("netlink in %s: %w", k.NetNS, err)
}

// checkNetAdmin reads the process's effective capabilities, so a missing
// privilege is reported as such before anything is tried.
func checkNetAdmin() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	if data[0].Effective&(1<<unix.CAP_NET_ADMIN) == 0 {
		return ErrNoNetAdmin
	}
	return nil
}

// Apply installs the routes and rules first (they route nothing until the
// table marks packets), then replaces the nftables table in one
// transaction. If a first install fails, what it added is removed.
func (k NetlinkKernel) Apply(rs RuleSet) error {
	nft, nl, done, err := k.handles()
	if err != nil {
		return err
	}
	defer done()
	fresh := true
	for _, f := range allFamilies {
		if t, err := findTable(nft, rs.Table, f); err != nil {
			return kernelErr("nftables: listing tables", err)
		} else if t != nil {
			fresh = false
		}
	}
	err = syncRoutes(nl, rs)
	if err == nil {
		err = k.replaceTable(nft, rs)
	}
	if err != nil && fresh {
		if rerr := removeAll(nft, nl, rs); rerr != nil {
			return fmt.Errorf("%w (and removing what was installed: %v)", err, rerr)
		}
	}
	return err
}

// Remove deletes the table, every ip rule at the rule priority and the
// routes of their tables and of rs's.
func (k NetlinkKernel) Remove(rs RuleSet) error {
	nft, nl, done, err := k.handles()
	if err != nil {
		return err
	}
	defer done()
	return removeAll(nft, nl, rs)
}

func findTable(nft *nftables.Conn, name string, f family) (*nftables.Table, error) {
	tables, err := nft.ListTablesOfFamily(f.nf)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == name })
	if i < 0 {
		return nil, nil
	}
	return tables[i], nil
}

// removeAll removes the table and the rules and routes of both families,
// whichever rs installs: a family a reload dropped goes too.
func removeAll(nft *nftables.Conn, nl *netlink.Handle, rs RuleSet) error {
	for _, f := range allFamilies {
		if t, err := findTable(nft, rs.Table, f); err != nil {
			return kernelErr("nftables: listing tables", err)
		} else if t != nil {
			nft.DelTable(t)
		}
	}
	if err := nft.Flush(); err != nil {
		return kernelErr("nftables: deleting table "+rs.Table, err)
	}
	for _, f := range allFamilies {
		ours, err := ourRules(nl, f, rs.RulePriority)
		if err != nil {
			return err
		}
		tables := map[int]bool{}
		for _, r := range rs.Routes {
			tables[int(r.Mark)] = true
		}
		for _, r := range ours {
			if err := nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return kernelErr(fmt.Sprintf("deleting %s rule fwmark %d lookup %d", f.name, r.Mark, r.Table), err)
			}
			tables[r.Table] = true
		}
		for t := range tables {
			if err := flushTable(nl, f, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// ourRules lists f's rules at prio: every rule there is ours. A host
// without IPv6 has none of that family.
func ourRules(nl *netlink.Handle, f family, prio int) ([]netlink.Rule, error) {
	all, err := nl.RuleList(f.af)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil, nil
	}
	if err != nil {
		return nil, kernelErr("listing "+f.name+" rules", err)
	}
	return slices.DeleteFunc(all, func(r netlink.Rule) bool { return r.Priority != prio }), nil
}

func flushTable(nl *netlink.Handle, f family, table int) error {
	routes, err := nl.RouteListFiltered(f.af, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	if err != nil {
		return kernelErr(fmt.Sprintf("listing %s routes of table %d", f.name, table), err)
	}
	for _, r := range routes {
		if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return kernelErr(fmt.Sprintf("deleting route %s of table %d", r, table), err)
		}
	}
	return nil
}

// syncRoutes makes, in each family rs installs, each node's table hold its
// default route via the node's next hop of that family (a local default
// route for a lower node), and the rules at the priority exactly one per
// node; a family rs does not install keeps no rule there.
func syncRoutes(nl *netlink.Handle, rs RuleSet) error {
	for _, f := range allFamilies {
		if err := syncFamily(nl, rs, f); err != nil {
			return err
		}
	}
	return nil
}

func syncFamily(nl *netlink.Handle, rs RuleSet, f family) error {
	ours, err := ourRules(nl, f, rs.RulePriority)
	if err != nil {
		return err
	}
	var want []Route
	if rs.wants(f) {
		want = rs.Routes
	}
	for _, r := range want {
		route := &netlink.Route{Family: f.af, Table: int(r.Mark), Dst: f.anyDst}
		what := fmt.Sprintf("node %q: %s route via next hop %s in table %d", r.Node, f.name, f.hop(r), r.Mark)
		if hop := f.hop(r); hop.IsValid() {
			route.Gw = hop.AsSlice()
		} else {
			what = fmt.Sprintf("%s local default route in table %d", f.name, r.Mark)
			lo, err := nl.LinkByName("lo")
			if err != nil {
				return kernelErr(what, err)
			}
			route.LinkIndex, route.Type, route.Scope = lo.Attrs().Index, unix.RTN_LOCAL, netlink.SCOPE_HOST
		}
		if err := nl.RouteReplace(route); err != nil {
			return kernelErr(what, err)
		}
	}
	for _, r := range ours {
		if !slices.ContainsFunc(want, func(w Route) bool { return int(w.Mark) == r.Table && w.Mark == r.Mark }) {
			if err := nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return kernelErr(fmt.Sprintf("deleting stale %s rule fwmark %d lookup %d", f.name, r.Mark, r.Table), err)
			}
			if err := flushTable(nl, f, r.Table); err != nil {
				return err
			}
		}
	}
	for _, w := range want {
		if slices.ContainsFunc(ours, func(r netlink.Rule) bool { return int(w.Mark) == r.Table && w.Mark == r.Mark }) {
			continue
		}
		rule := netlink.NewRule()
		rule.Family, rule.Priority, rule.Mark, rule.Table = f.af, rs.RulePriority, w.Mark, int(w.Mark)
		if err := nl.RuleAdd(rule); err != nil {
			return kernelErr(fmt.Sprintf("node %q: %s rule fwmark %d lookup %d", w.Node, f.name, w.Mark, w.Mark), err)
		}
	}
	return nil
}

// kernelErr names what failed and says why in an operator's words for the
// errors that have a known cause.
func kernelErr(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w: %w", what, ErrNoNetAdmin, err)
	case errors.Is(err, unix.ENETUNREACH), errors.Is(err, unix.EHOSTUNREACH): // IPv4, IPv6
		return fmt.Errorf("%s: the next hop is on no link of this host: %w", what, err)
	case errors.Is(err, unix.EAFNOSUPPORT):
		return fmt.Errorf("%s: IPv6 is not available on this host (give no IPv6 next hop; on a lower node, ip_versions 4): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
