// Package portrange provides the port side of N-tier cache redirection:
// layer4.matchers.port_range (the upper tier routes a flow to the
// lower-tier node whose exclusive range holds its port) and
// http.reverse_proxy.transport.port_range (a lower-tier node's outgoing
// connections take source ports from its own range). The tier map and the
// dialer are internal/srcports.
package portrange

import (
	"fmt"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// TierMapSource names a tier map: a JSON file both tiers load (so they
// cannot disagree) or the same map inline.
type TierMapSource struct {
	// TierMapFile is a JSON file: {"range":"1024-65535","nodes":[{"name":
	// "l2a","address":"10.0.0.3:8080","ports":"1024-33279"}, …]}; nodes
	// without ports share the range evenly, in listed order.
	TierMapFile string `json:"tier_map_file,omitempty"`
	// TierMap is the same map inline.
	TierMap *srcports.Map `json:"tier_map,omitempty"`
	// Node is this map's node whose ports are meant.
	Node string `json:"node,omitempty"`
}

func (s *TierMapSource) set() bool { return s.TierMapFile != "" || s.TierMap != nil }

// nodeRange loads the map and returns Node's range. what names the module
// in errors.
func (s *TierMapSource) nodeRange(what string) (srcports.Range, *srcports.Map, error) {
	if s.TierMapFile != "" && s.TierMap != nil {
		return srcports.Range{}, nil, fmt.Errorf("%s: give tier_map_file or tier_map, not both", what)
	}
	m := s.TierMap
	if s.TierMapFile != "" {
		var err error
		if m, err = srcports.Load(s.TierMapFile); err != nil {
			return srcports.Range{}, nil, fmt.Errorf("%s: %w", what, err)
		}
	} else if err := m.Resolve(); err != nil {
		return srcports.Range{}, nil, fmt.Errorf("%s: tier_map: %w", what, err)
	}
	if s.Node == "" {
		return srcports.Range{}, nil, fmt.Errorf("%s: a tier map needs node (one of %v)", what, m.Names())
	}
	n, ok := m.Node(s.Node)
	if !ok {
		return srcports.Range{}, nil, fmt.Errorf("%s: node %q is not in the tier map (nodes %v)", what, s.Node, m.Names())
	}
	return *n.Ports, m, nil
}
