package srcports

import (
	"net/netip"
	"strings"
	"testing"
)

func TestRouterScriptFromTierMap(t *testing.T) {
	m := &Map{Nodes: []Node{{Name: "l2a"}, {Name: "l2b"}}}
	if err := m.Resolve(); err != nil {
		t.Fatal(err)
	}
	gw := map[string]netip.Addr{"l2a": netip.MustParseAddr("10.0.0.3"), "l2b": netip.MustParseAddr("10.0.0.4")}
	s, err := RouterScript(m, netip.MustParseAddr("10.0.9.1"), gw, DefaultTableBase)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"flush table ip edgesteer_tiers\n",
		`ip daddr 10.0.9.1 tcp dport 1024-33279 meta mark set 101 counter comment "l2a"`,
		`ip daddr 10.0.9.1 tcp dport 33280-65535 meta mark set 102 counter comment "l2b"`,
		"ip -4 route replace 10.0.9.1/32 via 10.0.0.3 table 101\n",
		"ip -4 rule add fwmark 101 lookup 101\n",
		"ip -4 route replace 10.0.9.1/32 via 10.0.0.4 table 102\n",
		"ip -4 rule add fwmark 102 lookup 102\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	s6, err := RouterScript(m, netip.MustParseAddr("fd00::9:1"),
		map[string]netip.Addr{"l2a": netip.MustParseAddr("fd00::3"), "l2b": netip.MustParseAddr("fd00::4")}, 200)
	if err != nil || !strings.Contains(s6, `ip6 daddr fd00::9:1 tcp dport 1024-33279 meta mark set 201`) ||
		!strings.Contains(s6, "ip -6 route replace fd00::9:1/128 via fd00::3 table 201") {
		t.Fatalf("IPv6: %v\n%s", err, s6)
	}
	for name, tc := range map[string]struct {
		shared string
		gw     map[string]string
		want   string
	}{
		"missing node":   {"10.0.9.1", map[string]string{"l2a": "10.0.0.3"}, `no gateway address for node "l2b"`},
		"unknown node":   {"10.0.9.1", map[string]string{"l2a": "10.0.0.3", "l2b": "10.0.0.4", "l2z": "10.0.0.9"}, `node "l2z" is not in the tier map`},
		"mixed families": {"10.0.9.1", map[string]string{"l2a": "10.0.0.3", "l2b": "fd00::4"}, "different families"},
	} {
		g := map[string]netip.Addr{}
		for k, v := range tc.gw {
			g[k] = netip.MustParseAddr(v)
		}
		if _, err := RouterScript(m, netip.MustParseAddr(tc.shared), g, DefaultTableBase); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
