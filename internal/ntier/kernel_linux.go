package ntier

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
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
type NetlinkKernel struct{ NetNS string }

const bucketMap = "buckets"

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
	fresh := false
	if t, err := findTable(nft, rs.Table); err != nil {
		return kernelErr("nftables: listing tables", err)
	} else if t == nil {
		fresh = true
	}
	err = syncRoutes(nl, rs)
	if err == nil {
		err = replaceTable(nft, rs)
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

func findTable(nft *nftables.Conn, name string) (*nftables.Table, error) {
	tables, err := nft.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == name })
	if i < 0 {
		return nil, nil
	}
	return tables[i], nil
}

func removeAll(nft *nftables.Conn, nl *netlink.Handle, rs RuleSet) error {
	if t, err := findTable(nft, rs.Table); err != nil {
		return kernelErr("nftables: listing tables", err)
	} else if t != nil {
		nft.DelTable(t)
		if err := nft.Flush(); err != nil {
			return kernelErr("nftables: deleting table "+rs.Table, err)
		}
	}
	ours, err := ourRules(nl, rs.RulePriority)
	if err != nil {
		return err
	}
	tables := map[int]bool{}
	for _, r := range rs.Routes {
		tables[int(r.Mark)] = true
	}
	for _, r := range ours {
		if err := nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
			return kernelErr(fmt.Sprintf("deleting ip rule fwmark %d lookup %d", r.Mark, r.Table), err)
		}
		tables[r.Table] = true
	}
	for t := range tables {
		if err := flushTable(nl, t); err != nil {
			return err
		}
	}
	return nil
}

// ourRules lists the IPv4 rules at prio: every rule there is ours.
func ourRules(nl *netlink.Handle, prio int) ([]netlink.Rule, error) {
	all, err := nl.RuleList(unix.AF_INET)
	if err != nil {
		return nil, kernelErr("listing ip rules", err)
	}
	return slices.DeleteFunc(all, func(r netlink.Rule) bool { return r.Priority != prio }), nil
}

func flushTable(nl *netlink.Handle, table int) error {
	routes, err := nl.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return kernelErr(fmt.Sprintf("listing routes of table %d", table), err)
	}
	for _, r := range routes {
		if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return kernelErr(fmt.Sprintf("deleting route %s of table %d", r, table), err)
		}
	}
	return nil
}

// syncRoutes makes each node's table hold its default route via the
// node's next hop, and the rules at the priority exactly one per node.
func syncRoutes(nl *netlink.Handle, rs RuleSet) error {
	ours, err := ourRules(nl, rs.RulePriority)
	if err != nil {
		return err
	}
	for _, r := range rs.Routes {
		route := &netlink.Route{Table: int(r.Mark), Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
		what := fmt.Sprintf("node %q: route via next hop %s in table %d", r.Node, r.NextHop, r.Mark)
		if r.NextHop.IsValid() {
			route.Gw = r.NextHop.AsSlice()
		} else {
			what = fmt.Sprintf("local default route in table %d", r.Mark)
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
		if !slices.ContainsFunc(rs.Routes, func(w Route) bool { return int(w.Mark) == r.Table && w.Mark == r.Mark }) {
			if err := nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return kernelErr(fmt.Sprintf("deleting stale ip rule fwmark %d lookup %d", r.Mark, r.Table), err)
			}
			if err := flushTable(nl, r.Table); err != nil {
				return err
			}
		}
	}
	for _, w := range rs.Routes {
		if slices.ContainsFunc(ours, func(r netlink.Rule) bool { return int(w.Mark) == r.Table && w.Mark == r.Mark }) {
			continue
		}
		rule := netlink.NewRule()
		rule.Family, rule.Priority, rule.Mark, rule.Table = unix.AF_INET, rs.RulePriority, w.Mark, int(w.Mark)
		if err := nl.RuleAdd(rule); err != nil {
			return kernelErr(fmt.Sprintf("node %q: ip rule fwmark %d lookup %d", w.Node, w.Mark, w.Mark), err)
		}
	}
	return nil
}

// replaceTable adds, deletes and adds the table again with its contents
// in one batch: the kernel swaps the whole table atomically, and adding
// first makes the delete succeed when there was none.
func replaceTable(nft *nftables.Conn, rs RuleSet) error {
	table := &nftables.Table{Name: rs.Table, Family: nftables.TableFamilyIPv4}
	nft.AddTable(table)
	nft.DelTable(table)
	nft.AddTable(table)
	var set *nftables.Set
	priority := nftables.ChainPriorityMangle // tproxy's place
	if rs.Tproxy == 0 {
		priority = nftables.ChainPriorityRaw // before conntrack, for notrack
		set = &nftables.Set{Table: table, Name: bucketMap, IsMap: true,
			KeyType: nftables.TypeInteger, KeyByteOrder: binaryutil.NativeEndian, DataType: nftables.TypeMark}
		elems := make([]nftables.SetElement, len(rs.Marks))
		for b, m := range rs.Marks {
			elems[b] = nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(b)), Val: binaryutil.NativeEndian.PutUint32(m)}
		}
		if err := nft.AddSet(set, elems); err != nil {
			return fmt.Errorf("nftables: map %s: %w", bucketMap, err)
		}
	}
	chain := nft.AddChain(&nftables.Chain{
		Name: "prerouting", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: priority,
	})
	ifaces := rs.Interfaces
	if len(ifaces) == 0 {
		ifaces = []string{""}
	}
	for _, iface := range ifaces {
		for _, p := range rs.Ports {
			nft.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: ruleExprs(rs, iface, p.Lo, p.Hi, set)})
		}
	}
	if err := nft.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			// The batch names no missing object, so this is an expression
			// type (module) the kernel does not have.
			need := "nf_tables with hash, fib, notrack"
			if rs.Tproxy != 0 {
				need = "nf_tables with fib and tproxy (nft_tproxy, nf_tproxy_ipv4)"
			}
			err = fmt.Errorf("the kernel lacks an nftables feature the rules need (%s): %w", need, err)
		}
		return kernelErr("nftables: installing table "+rs.Table, err)
	}
	return nil
}

// ruleExprs: [iifname IFACE] tcp dport LO-HI fib daddr type != local, then
// notrack meta mark set jhash ip saddr mod N seed S map @buckets counter
// (upper tier) or meta mark set M tproxy to :P counter accept (lower).
func ruleExprs(rs RuleSet, iface string, lo, hi uint16, set *nftables.Set) []expr.Any {
	var e []expr.Any
	if iface != "" {
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, iface)
		e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name})
	}
	e = append(e,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	if lo == hi {
		e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(lo)})
	} else {
		e = append(e, &expr.Range{Op: expr.CmpOpEq, Register: 1,
			FromData: binaryutil.BigEndian.PutUint16(lo), ToData: binaryutil.BigEndian.PutUint16(hi)})
	}
	e = append(e,
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	if rs.Tproxy != 0 {
		// meta mark set M tproxy to :P accept
		return append(e,
			&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(rs.Routes[0].Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(rs.Tproxy)},
			&expr.TProxy{Family: byte(nftables.TableFamilyIPv4), TableFamily: byte(nftables.TableFamilyIPv4), RegPort: 1},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictAccept})
	}
	return append(e,
		&expr.Notrack{},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Hash{SourceRegister: 1, DestRegister: 1, Length: 4, Modulus: uint32(len(rs.Marks)),
			Seed: rs.Seed, Type: expr.HashTypeJenkins},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: set.Name, SetID: set.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Counter{},
	)
}

// kernelErr names what failed and says why in an operator's words for the
// errors that have a known cause.
func kernelErr(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w: %w", what, ErrNoNetAdmin, err)
	case errors.Is(err, unix.ENETUNREACH):
		return fmt.Errorf("%s: the next hop is on no link of this host: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
