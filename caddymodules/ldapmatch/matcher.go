// Package ldapmatch provides layer4.matchers.ldap: it parses a connection's
// first LDAPMessage and matches on its operation and bind DN. It sets the
// placeholders {l4.ldap.operation}, {l4.ldap.bind_dn} and
// {l4.ldap.bind_auth} (simple or sasl). Parsing lives in internal/ldapwire.
package ldapmatch

import (
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

func init() {
	caddy.RegisterModule(&MatchLDAP{})
}

// MatchLDAP matches connections whose first message is an LDAPMessage.
// Every condition set must hold.
type MatchLDAP struct {
	// Operations: bind, search, extended, unbind, … (any of them).
	Operations []string `json:"operations,omitempty"`
	// BindDNs: shell globs over the bind DN, case-insensitive (any of them).
	BindDNs []string `json:"bind_dns,omitempty"`
	// BindDNRegexp: a regular expression the bind DN must match.
	BindDNRegexp string `json:"bind_dn_regexp,omitempty"`
	// Anonymous: true matches only anonymous binds (empty DN), false only
	// named ones.
	Anonymous *bool `json:"anonymous,omitempty"`
	// StartTLS: true matches only a StartTLS request, false anything else.
	StartTLS *bool `json:"starttls,omitempty"`

	re *regexp.Regexp
}

// CaddyModule returns the Caddy module information.
func (*MatchLDAP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.matchers.ldap",
		New: func() caddy.Module { return new(MatchLDAP) },
	}
}

// Provision compiles and checks the patterns.
func (m *MatchLDAP) Provision(caddy.Context) error {
	for _, g := range m.BindDNs {
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("ldap matcher: bind_dn %q: %v", g, err)
		}
	}
	if m.BindDNRegexp != "" {
		re, err := regexp.Compile(m.BindDNRegexp)
		if err != nil {
			return fmt.Errorf("ldap matcher: bind_dn_regexp %q: %v", m.BindDNRegexp, err)
		}
		m.re = re
	}
	return nil
}

// Match parses the first message from the bytes prefetched for matching.
func (m *MatchLDAP) Match(cx *layer4.Connection) (bool, error) {
	msg, err := ldapwire.Read(cx, layer4.MaxMatchingBytes)
	if err != nil {
		if errors.Is(err, layer4.ErrConsumedAllPrefetchedBytes) || errors.Is(err, layer4.ErrMatchingBufferFull) {
			return false, err // caddy-l4 reads more and asks again
		}
		if errors.Is(err, io.EOF) || errors.Is(err, ldapwire.ErrMalformed) {
			return false, nil
		}
		return false, err
	}
	repl := cx.Replacer()
	repl.Set("l4.ldap.operation", msg.Op)
	repl.Set("l4.ldap.bind_dn", msg.BindDN)
	repl.Set("l4.ldap.bind_auth", msg.BindAuth)
	repl.Set("l4.ldap.message_id", strconv.FormatInt(msg.ID, 10))
	if len(m.Operations) > 0 && !slices.Contains(m.Operations, msg.Op) {
		return false, nil
	}
	if m.StartTLS != nil && *m.StartTLS != msg.StartTLS() {
		return false, nil
	}
	if m.Anonymous != nil && (msg.Op != "bind" || *m.Anonymous != msg.Anonymous) {
		return false, nil
	}
	if len(m.BindDNs) > 0 {
		dn := strings.ToLower(msg.BindDN)
		if !slices.ContainsFunc(m.BindDNs, func(g string) bool { ok, _ := path.Match(strings.ToLower(g), dn); return ok }) {
			return false, nil
		}
	}
	if m.re != nil && !m.re.MatchString(msg.BindDN) {
		return false, nil
	}
	return true, nil
}

// UnmarshalCaddyfile reads
//
//	ldap {
//		operation <op...>
//		bind_dn <glob...>
//		bind_dn_regexp <regexp>
//		anonymous true|false
//		starttls true|false
//	}
func (m *MatchLDAP) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "ldap matcher", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		var more []string
		switch o.Name() {
		case "operation": // lists: a repeat adds to them
			more, err = o.List()
			m.Operations = append(m.Operations, more...)
		case "bind_dn":
			more, err = o.List()
			m.BindDNs = append(m.BindDNs, more...)
		case "bind_dn_regexp":
			m.BindDNRegexp, err = o.String()
		case "anonymous":
			m.Anonymous, err = boolOption(o)
		case "starttls":
			m.StartTLS, err = boolOption(o)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func boolOption(o *cfparse.Block) (*bool, error) {
	b, err := o.Bool()
	return &b, err
}

// Interface guards
var (
	_ layer4.ConnMatcher    = (*MatchLDAP)(nil)
	_ caddy.Provisioner     = (*MatchLDAP)(nil)
	_ caddyfile.Unmarshaler = (*MatchLDAP)(nil)
)
