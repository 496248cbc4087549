// Package srcports holds N-tier's source-port ranges. The tier map gives
// each lower-tier node an exclusive range of source ports (by default
// 1024–65535 is split among them), so a flow's port alone names the node
// that opened it; both tiers load the same map, so they cannot disagree
// about who owns a port. A Dialer takes a node's outgoing source ports from
// its range, Usage counts the range's ports in use, and RouterScript turns
// the map into the shared-address router's rules.
package srcports

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Default range split among the lower-tier nodes: every unprivileged port.
const (
	DefaultLo = 1024
	DefaultHi = 65535
)

// Range is an inclusive port range.
type Range struct{ Lo, Hi uint16 }

// Parse reads "1024-33279" or a single port "8080".
func Parse(s string) (Range, error) {
	loS, hiS, isRange := strings.Cut(strings.TrimSpace(s), "-")
	lo, err1 := strconv.ParseUint(loS, 10, 16)
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.ParseUint(hiS, 10, 16)
	}
	if err1 != nil || err2 != nil || lo == 0 || hi < lo {
		return Range{}, fmt.Errorf("port range %q: want lo-hi with 1 <= lo <= hi <= 65535", s)
	}
	return Range{uint16(lo), uint16(hi)}, nil
}

// Contains reports whether p lies in r.
func (r Range) Contains(p uint16) bool { return p >= r.Lo && p <= r.Hi }

// Size is the number of ports in r.
func (r Range) Size() int { return int(r.Hi) - int(r.Lo) + 1 }

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// MarshalText and UnmarshalText let JSON carry ranges as "lo-hi".
func (r Range) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *Range) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	*r = v
	return err
}

// Node is one lower-tier node of the map.
type Node struct {
	Name string `json:"name"`
	// Address is where the upper tier reaches the node (informational
	// for the map; the upper tier's routes name their upstreams).
	Address string `json:"address,omitempty"`
	// Ports, if empty, is this node's even share of the map's range.
	Ports *Range `json:"ports,omitempty"`
	// NextHop is the node's address on a link of the upper tier, where
	// transparent mode routes its clients' packets (caddymodules/ntier).
	NextHop string `json:"next_hop,omitempty"`
	// NextHop6 is its IPv6 one, for a node that has both (an IPv6-only
	// node may give its address as next_hop).
	NextHop6 string `json:"next_hop6,omitempty"`
	// Health is the host:port transparent mode's upper tier connects to
	// to check the node (default: next_hop and the upper's health_port).
	Health string `json:"health,omitempty"`
}

// Map is the tier map. Its zero Range means DefaultLo-DefaultHi.
type Map struct {
	Range *Range `json:"range,omitempty"`
	Nodes []Node `json:"nodes"`
}

// Load reads a JSON tier map file and checks it.
func Load(path string) (*Map, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tier map: %w", err)
	}
	var m Map
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("tier map %s: %w", path, err)
	}
	if err := m.Resolve(); err != nil {
		return nil, fmt.Errorf("tier map %s: %w", path, err)
	}
	return &m, nil
}

// Resolve fills in the even split for nodes without ports and checks the
// map: unique names, ranges inside the map's range, no overlaps. Nodes
// either all give their ports or none do.
func (m *Map) Resolve() error {
	if m.Range == nil {
		m.Range = &Range{DefaultLo, DefaultHi}
	}
	if len(m.Nodes) == 0 {
		return errors.New("no nodes")
	}
	given := 0
	names := map[string]bool{}
	for _, n := range m.Nodes {
		if n.Name == "" {
			return errors.New("a node has no name")
		}
		if names[n.Name] {
			return fmt.Errorf("node %q listed twice", n.Name)
		}
		names[n.Name] = true
		if n.Ports != nil {
			given++
		}
	}
	switch given {
	case 0:
		return m.split()
	case len(m.Nodes):
	default:
		return errors.New("give ports for every node or for none (then the range is split evenly)")
	}
	for _, n := range m.Nodes {
		if n.Ports.Lo < m.Range.Lo || n.Ports.Hi > m.Range.Hi {
			return fmt.Errorf("node %q ports %s outside the map's range %s", n.Name, n.Ports, m.Range)
		}
	}
	sorted := slices.Clone(m.Nodes)
	slices.SortFunc(sorted, func(a, b Node) int { return int(a.Ports.Lo) - int(b.Ports.Lo) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Ports.Lo <= sorted[i-1].Ports.Hi {
			return fmt.Errorf("nodes %q (%s) and %q (%s) overlap", sorted[i-1].Name, sorted[i-1].Ports,
				sorted[i].Name, sorted[i].Ports)
		}
	}
	return nil
}

// split gives each node an even share, in listed order; the first
// size%n nodes get one port more.
func (m *Map) split() error {
	n := len(m.Nodes)
	size := m.Range.Size()
	if size < n {
		return fmt.Errorf("range %s has fewer ports than the %d nodes", m.Range, n)
	}
	lo := int(m.Range.Lo)
	for i := range m.Nodes {
		share := size / n
		if i < size%n {
			share++
		}
		m.Nodes[i].Ports = &Range{uint16(lo), uint16(lo + share - 1)}
		lo += share
	}
	return nil
}

// Node returns the named node.
func (m *Map) Node(name string) (Node, bool) {
	i := slices.IndexFunc(m.Nodes, func(n Node) bool { return n.Name == name })
	if i < 0 {
		return Node{}, false
	}
	return m.Nodes[i], true
}

// Owner returns the node whose range holds port p.
func (m *Map) Owner(p uint16) (Node, bool) {
	for _, n := range m.Nodes {
		if n.Ports.Contains(p) {
			return n, true
		}
	}
	return Node{}, false
}

// Names lists the node names, for error messages.
func (m *Map) Names() []string {
	out := make([]string, len(m.Nodes))
	for i, n := range m.Nodes {
		out[i] = n.Name
	}
	return out
}
