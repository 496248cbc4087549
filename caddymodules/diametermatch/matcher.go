// Package diametermatch provides layer4.matchers.diameter: it recognises a
// Diameter connection from its first message (version 1, a sane length, no
// reserved flags) and can match on its Application-Id, Command-Code,
// request flag, Origin-Host and Origin-Realm. Parsing lives in
// internal/diameter.
package diametermatch

import (
	"errors"
	"io"
	"math"
	"path"
	"slices"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/diameter"
)

func init() {
	caddy.RegisterModule(&MatchDiameter{})
}

// MatchDiameter matches connections whose first message is Diameter. Every
// list set must contain the message's value; lists of patterns use shell
// globs (pgw*.example).
type MatchDiameter struct {
	ApplicationIDs []uint32 `json:"application_ids,omitempty"`
	CommandCodes   []uint32 `json:"command_codes,omitempty"`
	// Request: true matches requests only, false answers only.
	Request      *bool    `json:"request,omitempty"`
	OriginHosts  []string `json:"origin_hosts,omitempty"`
	OriginRealms []string `json:"origin_realms,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*MatchDiameter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.matchers.diameter",
		New: func() caddy.Module { return new(MatchDiameter) },
	}
}

// Provision checks the patterns.
func (m *MatchDiameter) Provision(caddy.Context) error {
	for _, p := range append(slices.Clone(m.OriginHosts), m.OriginRealms...) {
		if _, err := path.Match(p, ""); err != nil {
			return errors.New("diameter matcher: bad pattern " + strconv.Quote(p))
		}
	}
	return nil
}

// Match reads the first message's header (and, when Origin-Host or -Realm
// is asked for, the whole first message, within caddy-l4's matching
// buffer).
func (m *MatchDiameter) Match(cx *layer4.Connection) (bool, error) {
	hb := make([]byte, diam.HeaderLength)
	if _, err := io.ReadFull(cx, hb); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	h, err := diameter.ParseHeader(hb, layer4.MaxMatchingBytes)
	if err != nil {
		return false, nil // not Diameter, or a first message too large to match on
	}
	if len(m.ApplicationIDs) > 0 && !slices.Contains(m.ApplicationIDs, h.ApplicationID) {
		return false, nil
	}
	if len(m.CommandCodes) > 0 && !slices.Contains(m.CommandCodes, h.CommandCode) {
		return false, nil
	}
	if m.Request != nil && *m.Request != (h.CommandFlags&diam.RequestFlag != 0) {
		return false, nil
	}
	if len(m.OriginHosts) == 0 && len(m.OriginRealms) == 0 {
		return true, nil
	}
	msg := make([]byte, h.MessageLength)
	copy(msg, hb)
	if _, err := io.ReadFull(cx, msg[diam.HeaderLength:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	in, err := diameter.Classify(msg, h)
	if err != nil {
		return false, nil
	}
	return globs(m.OriginHosts, in.OriginHost) && globs(m.OriginRealms, in.OriginRealm), nil
}

func globs(patterns []string, s string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

// UnmarshalCaddyfile reads
//
//	diameter {
//		application_id <id...>
//		command_code <code...>
//		request true|false
//		origin_host <glob...>
//		origin_realm <glob...>
//	}
//
// The list options may repeat (their values add up); request is given once.
func (m *MatchDiameter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "diameter matcher", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		switch o.Name() {
		case "application_id":
			m.ApplicationIDs, err = appendCodes(o, m.ApplicationIDs)
		case "command_code":
			m.CommandCodes, err = appendCodes(o, m.CommandCodes)
		case "request":
			var b bool
			if b, err = o.Bool(); err == nil {
				m.Request = &b
			}
		case "origin_host":
			var more []string
			more, err = o.List()
			m.OriginHosts = append(m.OriginHosts, more...)
		case "origin_realm":
			var more []string
			more, err = o.List()
			m.OriginRealms = append(m.OriginRealms, more...)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// appendCodes reads a list of 32-bit codes (Application-Id, Command-Code).
func appendCodes(o *cfparse.Block, codes []uint32) ([]uint32, error) {
	args, err := o.List()
	if err != nil {
		return nil, err
	}
	for _, a := range args {
		v, err := o.ParseInt(a, 0, math.MaxUint32)
		if err != nil {
			return nil, err
		}
		codes = append(codes, uint32(v))
	}
	return codes, nil
}

// Interface guards
var (
	_ layer4.ConnMatcher    = (*MatchDiameter)(nil)
	_ caddy.Provisioner     = (*MatchDiameter)(nil)
	_ caddyfile.Unmarshaler = (*MatchDiameter)(nil)
)
