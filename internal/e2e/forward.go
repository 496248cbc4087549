package e2e

import (
	"net/netip"
	"testing"
)

// ForwardVia makes router a forwarding hop for client's traffic to dst (a
// prefix): router forwards without ICMP redirects (its next hops share its
// link) and runs conntrack (a forward-chain ct rule, as under any stateful
// firewall, so a flow it does not track is the rules' doing), and client
// routes dst through it. Client gets n more addresses, 10.77.0.100 on,
// which are returned: distinct client addresses for tests that hash them.
func (tp *Topology) ForwardVia(t testing.TB, router, client, dst string, n int) []netip.Addr {
	t.Helper()
	tp.Run(t, router, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
		"net.ipv4.conf.eth0.send_redirects=0")
	tp.Run(t, router, "nft", "add table ip ctprobe; add chain ip ctprobe forwarded { type filter hook forward priority 0; }; "+
		"add rule ip ctprobe forwarded ct state new counter")
	tp.Run(t, client, "ip", "route", "add", dst, "via", tp.IP(router))
	var addrs []netip.Addr
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 77, 0, byte(100 + i)})
		tp.Run(t, client, "ip", "addr", "add", a.String()+"/24", "dev", "eth0")
		addrs = append(addrs, a)
	}
	return addrs
}
