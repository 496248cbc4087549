package portrange

import (
	"fmt"
	"net"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

func init() {
	caddy.RegisterModule(&MatchPortRange{})
}

// MatchPortRange matches a connection whose remote (default) or local port
// lies in one of the ranges: the given Ports, or Node's range in the tier
// map. It reads no bytes, so it decides at once. This is NetScaler's
// policy-based routing on the upper tier: a flow whose port lies in node
// X's exclusive range belongs to node X.
type MatchPortRange struct {
	// Side is "remote" (the peer's port, default) or "local" (the port the
	// connection arrived on, e.g. a listener over a port range).
	Side string `json:"side,omitempty"`
	// Ports are ranges "lo-hi" or single ports.
	Ports []string `json:"ports,omitempty"`
	TierMapSource

	ranges []srcports.Range
}

// CaddyModule returns the Caddy module information.
func (*MatchPortRange) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.matchers.port_range",
		New: func() caddy.Module { return new(MatchPortRange) },
	}
}

// Provision parses the ranges and loads the tier map.
func (m *MatchPortRange) Provision(caddy.Context) error {
	switch m.Side {
	case "":
		m.Side = "remote"
	case "remote", "local":
	default:
		return fmt.Errorf("port_range matcher: side %q: want remote or local", m.Side)
	}
	for _, s := range m.Ports {
		r, err := srcports.Parse(s)
		if err != nil {
			return fmt.Errorf("port_range matcher: ports: %w", err)
		}
		m.ranges = append(m.ranges, r)
	}
	if m.set() {
		r, _, err := m.nodeRange("port_range matcher")
		if err != nil {
			return err
		}
		m.ranges = append(m.ranges, r)
	} else if m.Node != "" {
		return fmt.Errorf("port_range matcher: node %q needs tier_map", m.Node)
	}
	if len(m.ranges) == 0 {
		return fmt.Errorf("port_range matcher: give ports or tier_map and node")
	}
	return nil
}

// Match checks the connection's port.
func (m *MatchPortRange) Match(cx *layer4.Connection) (bool, error) {
	addr := cx.RemoteAddr()
	if m.Side == "local" {
		addr = cx.LocalAddr()
	}
	var port int
	switch a := addr.(type) {
	case *net.TCPAddr:
		port = a.Port
	case *net.UDPAddr:
		port = a.Port
	default:
		return false, nil
	}
	for _, r := range m.ranges {
		if r.Contains(uint16(port)) {
			return true, nil
		}
	}
	return false, nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*MatchPortRange)(nil)
	_ layer4.ConnMatcher    = (*MatchPortRange)(nil)
	_ caddyfile.Unmarshaler = (*MatchPortRange)(nil)
)
