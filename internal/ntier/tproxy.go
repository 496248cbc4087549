package ntier

import (
	"fmt"
	"slices"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// Defaults of TproxyConfig.
const (
	DefaultTproxyTable    = "edgesteer_tproxy"
	DefaultTproxyMark     = 300 // firewall mark and routing table of local delivery
	DefaultTproxyPriority = 20001
)

// TproxyConfig is a lower-tier node's interception: TCP packets for any
// destination address on Ports, routed to this node by the upper tier, are
// delivered to the transparent (IP_TRANSPARENT) listener on ListenPort,
// which sees the client's address as remote and the original destination
// as local. The rules:
//
//	table ip edgesteer_tproxy {   # and table ip6 edgesteer_tproxy alike
//		chain prerouting {
//			type filter hook prerouting priority mangle;
//			tcp dport 80 fib daddr type != local meta mark set 300 tproxy to :3129 accept
//		}
//	}
//	ip rule add fwmark 300 lookup 300 pref 20001
//	ip route replace local default dev lo table 300
//	(and ip -6 rule / ip -6 route alike for IPv6)
//
// tproxy finds an established socket of the flow first, so one rule serves
// the whole connection.
type TproxyConfig struct {
	Ports        []srcports.Range
	Interfaces   []string
	ListenPort   uint16
	Mark         uint32 // also the routing table (DefaultTproxyMark)
	RulePriority int    // DefaultTproxyPriority
	Table        string // DefaultTproxyTable
	// IPVersions are the families intercepted: 4, 6 or both (the default).
	IPVersions []int
}

// TproxyRules validates cfg (after defaults) and returns its rule set.
func TproxyRules(cfg TproxyConfig) (RuleSet, error) {
	if cfg.Mark == 0 {
		cfg.Mark = DefaultTproxyMark
	}
	if cfg.RulePriority == 0 {
		cfg.RulePriority = DefaultTproxyPriority
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTproxyTable
	}
	if err := checkPorts(cfg.Ports); err != nil {
		return RuleSet{}, err
	}
	if err := checkInterfaces(cfg.Interfaces); err != nil {
		return RuleSet{}, err
	}
	v4, v6 := len(cfg.IPVersions) == 0, len(cfg.IPVersions) == 0
	for _, v := range cfg.IPVersions {
		switch {
		case v == 4 && !v4:
			v4 = true
		case v == 6 && !v6:
			v6 = true
		default:
			return RuleSet{}, fmt.Errorf("ip_versions %v: want 4, 6 or both, once each", cfg.IPVersions)
		}
	}
	switch {
	case cfg.ListenPort == 0:
		return RuleSet{}, fmt.Errorf("listen port 0: want the transparent listener's port")
	case cfg.Mark >= 253 && cfg.Mark <= 255 || cfg.Mark >= 1<<31:
		return RuleSet{}, fmt.Errorf("mark %d: it is also the routing table: avoid 253-255 (default, main, local), fit 31 bits", cfg.Mark)
	case cfg.RulePriority < 1 || cfg.RulePriority >= 32766:
		return RuleSet{}, fmt.Errorf("rule_priority %d: want 1 to 32765 (before the main table's rule)", cfg.RulePriority)
	}
	return RuleSet{
		Table: cfg.Table, IPv4: v4, IPv6: v6, Ports: slices.Clone(cfg.Ports), Interfaces: slices.Clone(cfg.Interfaces),
		RulePriority: cfg.RulePriority, Tproxy: cfg.ListenPort,
		Routes: []Route{{Node: "local", Mark: cfg.Mark}},
	}, nil
}
