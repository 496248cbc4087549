package portrange

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

// UnmarshalCaddyfile reads
//
//	port_range [remote|local] [<ranges...>] {
//		side remote|local
//		ports <ranges...>
//		tier_map <file>
//		node <name>
//	}
//
// ports is a list (it adds to the ranges on the matcher's line); every other
// option is given once, and side only if the line does not name it.
func (m *MatchPortRange) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	args, o, err := cfparse.Open(d, "port_range matcher", 0, cfparse.Many)
	if err != nil {
		return err
	}
	if len(args) > 0 && (args[0] == "remote" || args[0] == "local") {
		m.Side, args = args[0], args[1:]
	}
	sideOnLine := m.Side != ""
	m.Ports = append(m.Ports, args...)
	for o.Next() {
		if ok, err := m.unmarshalOption(o); ok {
			if err != nil {
				return err
			}
			continue
		}
		switch o.Name() {
		case "side":
			if sideOnLine {
				return o.Errf("given twice (first on the matcher's line)")
			}
			m.Side, err = o.String()
		case "ports":
			var more []string
			more, err = o.List()
			m.Ports = append(m.Ports, more...)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile reads
//
//	transport port_range {
//		ports <lo-hi>
//		tier_map <file>
//		node <name>
//		local_ip <ip>
//		usip
//		http {
//			<Caddy http transport options>
//		}
//	}
//
// Each option is given once.
func (t *Transport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "port_range transport", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		ok, err := t.UnmarshalOption(o)
		if !ok {
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalOption reads the option of the transport at o's cursor; it
// reports whether the option was one of the transport's. cache_redirect
// shares them, in its own block (so a repeat across both is caught).
func (t *Transport) UnmarshalOption(o *cfparse.Block) (bool, error) {
	if ok, err := t.unmarshalOption(o); ok {
		return true, err
	}
	var err error
	switch o.Name() {
	case "ports":
		t.Ports, err = o.String()
	case "local_ip":
		t.LocalIP, err = o.String()
	case "usip":
		err = o.Flag()
		t.USIP = err == nil
	case "http":
		if err = o.Once(); err == nil {
			_, err = o.BlockArgs(0, 0)
		}
		if err == nil {
			t.HTTP = new(reverseproxy.HTTPTransport)
			err = t.HTTP.UnmarshalCaddyfile(o.Dispenser().NewFromNextSegment())
		}
	default:
		return false, nil
	}
	return true, err
}

// unmarshalOption reads the tier map options shared by the modules'
// Caddyfile blocks; it reports whether the option was one of them.
func (s *TierMapSource) unmarshalOption(o *cfparse.Block) (bool, error) {
	var err error
	switch o.Name() {
	case "tier_map":
		s.TierMapFile, err = o.String()
	case "node":
		s.Node, err = o.String()
	default:
		return false, nil
	}
	return true, err
}
