package ntier_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ntier"
	"github.com/edgesteer/edgesteer/internal/srcports"
)

// tproxyCaddyfile: an HTTP server and a layer4 server on `bind
// tproxy/[::]` listeners (both families). The HTTP answer carries the
// original destination ({http.request.local}) and the client's address;
// the layer4 route proxies each connection to its original destination,
// {l4.conn.local_addr}, resolved per connection.
const tproxyCaddyfile = `{
	auto_https off
	layer4 {
		tproxy/[::]:3130 {
			route {
				proxy {l4.conn.local_addr}
			}
		}
	}
}
http://:3129 {
	bind tproxy/[::]
	header X-Original-Dst {http.request.local}
	respond "{http.request.local} {http.request.remote.host}"
}
`

// bin/caddy on a lower node, behind the node's tproxy rules
// (ntier.TproxyRules, installed here with ntier.NetlinkKernel): port 80
// goes to its HTTP server, port 8080 to its layer4 server, for any
// destination of either family. The HTTP server sees the client's own
// address as remote and the address the client asked for as local; the
// layer4 route proxies to {l4.conn.local_addr}, so the origin that answers
// is the very address the client asked for, seen from the lower node.
func TestTproxyNetworkEndToEnd(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "l2a": 2, "origin": 6})
	tp.EnableIPv6(t)
	origins := []string{"203.0.113.80", "198.51.100.9", "2001:db8:80::80"}
	for _, o := range origins {
		bits := map[bool]string{true: "/128", false: "/32"}[strings.Contains(o, ":")]
		tp.Run(t, "origin", "ip", "addr", "add", o+bits, "dev", "lo")
		gw, lower := tp.IP("origin"), tp.IP("l2a")
		if strings.Contains(o, ":") {
			gw, lower = tp.IP6("origin"), tp.IP6("l2a")
		}
		tp.Run(t, "client", "ip", "route", "add", o, "via", lower)
		tp.Run(t, "l2a", "ip", "route", "add", o, "via", gw)
	}
	kernel := ntier.NetlinkKernel{NetNS: "/var/run/netns/" + tp.NS("l2a")}
	for i, listen := range []uint16{3129, 3130} {
		port := []uint16{80, 8080}[i]
		rs, err := ntier.TproxyRules(ntier.TproxyConfig{Ports: []srcports.Range{{Lo: port, Hi: port}}, ListenPort: listen,
			Table: fmt.Sprintf("edgesteer_tproxy%d", i), Mark: uint32(300 + i), RulePriority: 20001 + i})
		if err != nil {
			t.Fatal(err)
		}
		if err := kernel.Apply(rs); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { kernel.Remove(rs) })
	}
	// The origin answers each connection with its local and remote address.
	var ln net.Listener
	if err := tp.In("origin", func() (err error) { ln, err = net.Listen("tcp", ":8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr())
			c.Close()
		}
	}()
	tp.StartCaddy(t, "l2a", tproxyCaddyfile, t.TempDir(), nil)

	client := tp.HTTPClient("client")
	for _, o := range origins {
		origin := netip.MustParseAddr(o)
		self := tp.IP("client")
		if origin.Is6() {
			self = tp.IP6("client")
		}
		resp, err := client.Get("http://" + netip.AddrPortFrom(origin, 80).String() + "/")
		if err != nil {
			t.Fatalf("GET http://%s/: %v", o, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%s %s", netip.AddrPortFrom(origin, 80), self); strings.TrimSpace(string(body)) != want {
			t.Errorf("GET http://%s/: %d %q, want %q (local: the address asked for; remote: the client's)", o, resp.StatusCode, body, want)
		}
		if got, want := resp.Header.Get("X-Original-Dst"), netip.AddrPortFrom(origin, 80).String(); got != want {
			t.Errorf("GET http://%s/: X-Original-Dst %q, want %q", o, got, want)
		}

		dst := netip.AddrPortFrom(origin, 8080).String()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := tp.Dialer("client", nil)(ctx, "tcp", dst)
		cancel()
		if err != nil {
			t.Fatalf("layer4 %s: %v", dst, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		f := strings.Fields(line)
		lower := tp.IP("l2a")
		if origin.Is6() {
			lower = tp.IP6("l2a")
		}
		if len(f) == 2 {
			f[1], _, _ = net.SplitHostPort(f[1])
		}
		if err != nil || len(f) != 2 || f[0] != dst || f[1] != lower {
			t.Errorf("layer4 %s: the origin answered %q (%v); want it reached at %s from the lower node %s", dst, line, err, dst, lower)
		}
	}
}
