package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// IP6 is host's IPv6 address once EnableIPv6 has run: fd77::N for
// 10.77.0.N.
func (tp *Topology) IP6(host string) string {
	return "fd77::" + strings.TrimPrefix(tp.ips[host], "10.77.0.")
}

// EnableIPv6 gives every host its IP6 address (fd77::/64 on the same
// bridge), without duplicate address detection so it is usable at once.
func (tp *Topology) EnableIPv6(t testing.TB) {
	t.Helper()
	for h := range tp.ips {
		tp.Run(t, h, "ip", "-6", "addr", "add", tp.IP6(h)+"/64", "dev", "eth0", "nodad")
	}
}

// ForwardVia6 is ForwardVia for IPv6 (after EnableIPv6): router forwards
// IPv6 and runs conntrack on it, client routes dst through router and gets
// n more addresses, fd77::1:0 on, which are returned.
func (tp *Topology) ForwardVia6(t testing.TB, router, client, dst string, n int) []netip.Addr {
	t.Helper()
	tp.Run(t, router, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	tp.Run(t, router, "nft", "add table ip6 ctprobe6; add chain ip6 ctprobe6 forwarded { type filter hook forward priority 0; }; "+
		"add rule ip6 ctprobe6 forwarded ct state new counter")
	tp.Run(t, client, "ip", "-6", "route", "add", dst, "via", tp.IP6(router))
	var addrs []netip.Addr
	for i := range n {
		a := netip.MustParseAddr(fmt.Sprintf("fd77::1:%x", i))
		tp.Run(t, client, "ip", "-6", "addr", "add", a.String()+"/64", "dev", "eth0", "nodad")
		addrs = append(addrs, a)
	}
	return addrs
}
