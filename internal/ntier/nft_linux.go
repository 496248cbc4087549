package ntier

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

// replaceTable replaces the table, in each family rs installs, with its
// contents, and deletes it in a family rs does not install, all in one
// batch: the kernel swaps everything atomically. Adding a table before
// deleting it makes the delete succeed when there was none.
func (k NetlinkKernel) replaceTable(nft *nftables.Conn, rs RuleSet) error {
	for _, f := range allFamilies {
		table := &nftables.Table{Name: rs.Table, Family: f.nf}
		if !rs.wants(f) {
			if t, err := findTable(nft, rs.Table, f); err != nil {
				return kernelErr("nftables: listing tables", err)
			} else if t != nil {
				nft.DelTable(t)
			}
			continue
		}
		nft.AddTable(table)
		nft.DelTable(table)
		nft.AddTable(table)
		if err := k.addChain(nft, table, rs, f); err != nil {
			return err
		}
	}
	if err := nft.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			// The batch names no missing object, so this is an expression
			// type (module) the kernel does not have.
			need := "nf_tables with hash, fib, notrack"
			if rs.Tproxy != 0 {
				need = "nf_tables with fib and tproxy (nft_tproxy, nf_tproxy_ipv4"
				if rs.IPv6 {
					need += ", nf_tproxy_ipv6"
				}
				need += ")"
			}
			err = fmt.Errorf("the kernel lacks an nftables feature the rules need (%s): %w", need, err)
		}
		return kernelErr("nftables: installing table "+rs.Table, err)
	}
	return nil
}

// addChain adds, to the batch, table's bucket map (upper tier) and its
// prerouting chain with a rule per interface and port range.
func (k NetlinkKernel) addChain(nft *nftables.Conn, table *nftables.Table, rs RuleSet, f family) error {
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
			exprs := ruleExprs(rs, f, iface, p.Lo, p.Hi, set)
			if i := slices.IndexFunc(exprs, isTproxy); i >= 0 && k.WithoutTproxy {
				exprs[i] = &expr.Match{Name: "edgesteer_absent", Info: &xt.Unknown{}}
			}
			nft.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: exprs})
		}
	}
	return nil
}

func isTproxy(e expr.Any) bool { _, ok := e.(*expr.TProxy); return ok }

// ruleExprs: [iifname IFACE] tcp dport LO-HI fib daddr type != local, then
// notrack meta mark set jhash ip saddr (ip6 saddr) mod N seed S map
// @buckets counter (upper tier) or meta mark set M tproxy to :P counter
// accept (lower).
func ruleExprs(rs RuleSet, f family, iface string, lo, hi uint16, set *nftables.Set) []expr.Any {
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
			&expr.TProxy{Family: byte(f.nf), TableFamily: byte(f.nf), RegPort: 1},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictAccept})
	}
	return append(e,
		&expr.Notrack{},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.alen},
		&expr.Hash{SourceRegister: 1, DestRegister: 1, Length: f.alen, Modulus: uint32(len(rs.Marks)),
			Seed: rs.Seed, Type: expr.HashTypeJenkins},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: set.Name, SetID: set.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Counter{},
	)
}
