package portrange

import (
	"net"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// A real TCP connection from a chosen source port, matched on either side.
func TestMatchRemoteAndLocalPorts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Find a free source port below the ephemeral range.
	var client net.Conn
	var src int
	for p := 21000; p < 21100 && client == nil; p++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}}
		if c, err := d.Dial("tcp", l.Addr().String()); err == nil {
			client, src = c, p
		}
	}
	if client == nil {
		t.Fatal("no free source port")
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	cx := layer4.WrapConnection(server, nil, zap.NewNop())
	local := l.Addr().(*net.TCPAddr).Port

	tiers := &srcports.Map{Range: &srcports.Range{Lo: 20000, Hi: 21999}, Nodes: []srcports.Node{{Name: "x"}, {Name: "y"}}}
	cases := []struct {
		name string
		m    MatchPortRange
		want bool
	}{
		{"remote in range", MatchPortRange{Ports: []string{"21000-21099"}}, true},
		{"remote exact", MatchPortRange{Ports: []string{strconv.Itoa(src)}}, true},
		{"remote outside", MatchPortRange{Ports: []string{"1024-2000"}}, false},
		{"local port", MatchPortRange{Side: "local", Ports: []string{strconv.Itoa(local)}}, true},
		{"local, remote's range", MatchPortRange{Side: "local", Ports: []string{"21000-21099"}}, false},
		{"tier map owner", MatchPortRange{TierMapSource: TierMapSource{TierMap: tiers, Node: "y"}}, true},
		{"tier map other node", MatchPortRange{TierMapSource: TierMapSource{TierMap: tiers, Node: "x"}}, false},
	}
	for _, tc := range cases {
		m := tc.m
		if err := m.Provision(caddy.Context{}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, err := m.Match(cx); err != nil || got != tc.want {
			t.Errorf("%s: source port %d, local %d: got %v %v", tc.name, src, local, got, err)
		}
	}
}
