// Package ntier is the control plane of transparent N-tier cache
// redirection's upper tier: which lower-tier node each hash bucket of client
// addresses goes to, the nodes' health, the kernel rules that carry it out,
// and their idempotent install and removal. The data path is the kernel's;
// nothing of this package sits on it. It knows nothing of Caddy: the kernel
// is behind the Kernel interface (nftables and policy routing through
// netlink in production, a fake in tests).
//
// # Why nftables with notrack and a hash map, not IPVS
//
// The upper tier must forward each client packet to a lower node chosen by a
// stateless hash of the client address, without rewriting addresses and
// without a per-client table. The rules (see RuleSet) are:
//
//	table ip edgesteer_ntier {
//		map buckets { type integer : mark; elements = { 0 : 201, 1 : 202, … } }
//		chain prerouting {
//			type filter hook prerouting priority raw;
//			tcp dport 80 fib daddr type != local notrack
//				meta mark set jhash ip saddr mod 256 seed 0x4e544952 map @buckets counter
//		}
//	}
//	ip rule add fwmark 201 lookup 201 pref 20000;  ip route replace default via <l2a> table 201
//	ip rule add fwmark 202 lookup 202 pref 20000;  ip route replace default via <l2b> table 202
//
// IPv6 has the same rules in `table ip6 edgesteer_ntier` (`jhash ip6
// saddr`), with `ip -6 rule` and an IPv6 default route via each node's
// IPv6 next hop in the same tables; a family is installed when the nodes
// have next hops of it.
//
// The packet keeps its addresses; only its next hop (so its destination MAC
// address: NetScaler's MAC-based redirection) is the lower node's. notrack
// at raw priority keeps conntrack out, so the upper tier holds nothing per
// flow; the mark is computed again for every packet from the source address
// alone, so every packet of a flow takes the same node.
//
// IPVS is not used: even in direct-routing mode without persistence it
// keeps a connection entry per flow (ip_vs_conn), which is exactly the
// session table the seed's sessionless upper tier avoids, it needs a
// virtual service per destination (or an fwmark service, i.e. nftables
// anyway) to catch any destination address, and its source-hash scheduler
// reshuffles more than the dead node's clients when weights change.
// nftables' `fwd ip to … device` (netdev ingress) would also forward by
// next hop without conntrack, but it needs every ingress device named, does
// not route (no TTL decrement, no ICMP), and cannot take its next hop from
// a map of the hash in nft 1.0.6; policy routing keeps the kernel's
// ordinary forwarding.
//
// Moving buckets is one nftables transaction (the table is replaced in one
// batch): a packet sees the old map or the new one, never a mix, and the
// routes and rules of the nodes do not change when a node goes down.
//
// # Which node a bucket goes to
//
// A client address a falls in bucket Bucket(a) (the kernel's jhash, which
// this package computes the same way). Bucket b's documented node is node
// b mod N in configured order. While it is down, b goes to the first live
// node in rendezvous order of (b, node names) (internal/placement.Rank):
// only the dead node's buckets move, spread over the others, and they come
// back to it when it returns. A second node failing moves only that node's
// buckets, since each bucket's order does not depend on which nodes are up.
// With every node down the documented assignment stays: there is nowhere
// better to send the packets.
package ntier
