package srcports

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultTableBase is the first routing table (and firewall mark) that
// RouterScript uses: node i of the map gets base+1+i.
const DefaultTableBase = 100

// RouterScript returns a shell script for the router in front of the
// origins in NetScaler's N-tier topology: every lower-tier node sends from one
// shared source address, and the origins' replies to it reach the router,
// which sends each reply to the node that owns its destination port (an
// nftables mark per node range, a policy rule per mark, a route to the node
// in that rule's table). The tier map stays the one source of truth: the
// same file configures the nodes' ranges and, through this, the router.
// gateways maps every node name to the address the router reaches it at.
// The script replaces what an earlier run of it installed.
func RouterScript(m *Map, shared netip.Addr, gateways map[string]netip.Addr, tableBase int) (string, error) {
	if !shared.IsValid() {
		return "", fmt.Errorf("shared source address missing")
	}
	shared = shared.Unmap()
	family, ipFamily, bits := "ip", "-4", 32
	if shared.Is6() {
		family, ipFamily, bits = "ip6", "-6", 128
	}
	if tableBase < 1 || tableBase+len(m.Nodes) > 0x7fffffff {
		return "", fmt.Errorf("table base %d out of range", tableBase)
	}
	for name := range gateways {
		if _, ok := m.Node(name); !ok {
			return "", fmt.Errorf("node %q is not in the tier map (nodes: %s)", name, strings.Join(m.Names(), ", "))
		}
	}
	var nft, rules strings.Builder
	table := "edgesteer_tiers"
	fmt.Fprintf(&nft, "add table %s %s\nflush table %s %s\ntable %s %s {\n", family, table, family, table, family, table)
	fmt.Fprintf(&nft, "\tchain prerouting {\n\t\ttype filter hook prerouting priority mangle; policy accept;\n")
	for i, n := range m.Nodes {
		gw, ok := gateways[n.Name]
		if !ok {
			return "", fmt.Errorf("no gateway address for node %q", n.Name)
		}
		gw = gw.Unmap()
		if gw.Is6() != shared.Is6() {
			return "", fmt.Errorf("node %q: gateway %s and shared address %s are of different families", n.Name, gw, shared)
		}
		mark := tableBase + 1 + i
		fmt.Fprintf(&nft, "\t\t%s daddr %s tcp dport %d-%d meta mark set %d counter comment %q\n",
			family, shared, n.Ports.Lo, n.Ports.Hi, mark, n.Name)
		fmt.Fprintf(&rules, "# %s: ports %s\n", n.Name, n.Ports)
		fmt.Fprintf(&rules, "ip %s route replace %s/%d via %s table %d\n", ipFamily, shared, bits, gw, mark)
		fmt.Fprintf(&rules, "while ip %s rule del fwmark %d lookup %d 2>/dev/null; do :; done\n", ipFamily, mark, mark)
		fmt.Fprintf(&rules, "ip %s rule add fwmark %d lookup %d\n", ipFamily, mark, mark)
	}
	nft.WriteString("\t}\n}\n")
	return fmt.Sprintf(`#!/bin/sh
# Router for the lower tier's shared source address %s: the origins' replies
# go back to the node that owns their destination port (from the tier map).
# Needs nftables and iproute2; run as root on the router, with forwarding on.
set -e
nft -f - <<'NFT'
%sNFT
%s`, shared, nft.String(), rules.String()), nil
}
