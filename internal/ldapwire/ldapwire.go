// Package ldapwire reads LDAP messages (RFC 4511) off a stream for a
// tenant router: it frames each LDAPMessage with github.com/go-asn1-ber,
// names its operation, and takes a BindRequest's DN apart to find the
// tenant (DNs parsed by github.com/go-ldap/ldap). It knows nothing of Caddy.
package ldapwire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"
)

// ErrMalformed marks bytes that are not a well-formed LDAPMessage.
var ErrMalformed = errors.New("malformed LDAP message")

// StartTLSOID is the extended operation that upgrades to TLS.
const StartTLSOID = "1.3.6.1.4.1.1466.20037"

// DefaultMaxLength bounds one message; longer ones are refused.
const DefaultMaxLength = 64 * 1024

// Message is what the router needs to know of one LDAPMessage.
type Message struct {
	ID        int64
	Op        string // "bind", "unbind", "search", "extended", … ("op-N" for others)
	BindDN    string // BindRequest only
	BindAuth  string // "simple" or "sasl", BindRequest only
	Extended  string // ExtendedRequest's name (OID)
	Raw       []byte // the message's bytes, to forward as they came
	Anonymous bool   // a simple bind with an empty DN
}

// StartTLS reports whether the message asks to start TLS.
func (m *Message) StartTLS() bool { return m.Op == "extended" && m.Extended == StartTLSOID }

var opNames = map[ber.Tag]string{
	ldap.ApplicationBindRequest:       "bind",
	ldap.ApplicationUnbindRequest:     "unbind",
	ldap.ApplicationSearchRequest:     "search",
	ldap.ApplicationModifyRequest:     "modify",
	ldap.ApplicationAddRequest:        "add",
	ldap.ApplicationDelRequest:        "delete",
	ldap.ApplicationModifyDNRequest:   "modify_dn",
	ldap.ApplicationCompareRequest:    "compare",
	ldap.ApplicationAbandonRequest:    "abandon",
	ldap.ApplicationExtendedRequest:   "extended",
	ldap.ApplicationBindResponse:      "bind_response",
	ldap.ApplicationSearchResultEntry: "search_entry",
	ldap.ApplicationSearchResultDone:  "search_done",
	ldap.ApplicationExtendedResponse:  "extended_response",
}

// Read reads one LDAPMessage of at most maxLen bytes from r. An EOF before
// the first byte is io.EOF; an error of r itself (other than EOF) comes
// back unchanged, so a caller can tell "wait for more bytes" from bad
// bytes; anything else wrong is ErrMalformed.
func Read(r io.Reader, maxLen int64) (*Message, error) {
	var raw bytes.Buffer
	src := &errorKeeper{r: r}
	lr := &io.LimitedReader{R: src, N: maxLen}
	p, err := ber.ReadPacket(io.TeeReader(lr, &raw))
	if err != nil {
		if src.err != nil && !errors.Is(src.err, io.EOF) {
			return nil, src.err
		}
		if raw.Len() == 0 && errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if lr.N == 0 {
			return nil, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, maxLen)
		}
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	m, err := parse(p)
	if err != nil {
		return nil, err
	}
	m.Raw = raw.Bytes()
	return m, nil
}

// Parse decodes one complete LDAPMessage held in b.
func Parse(b []byte) (*Message, error) {
	p, err := ber.DecodePacketErr(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	m, err := parse(p)
	if err != nil {
		return nil, err
	}
	m.Raw = b
	return m, nil
}

func parse(p *ber.Packet) (*Message, error) {
	bad := func(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }
	if p.ClassType != ber.ClassUniversal || p.Tag != ber.TagSequence || len(p.Children) < 2 {
		return nil, bad("not an LDAPMessage sequence")
	}
	id, ok := p.Children[0].Value.(int64)
	if !ok {
		return nil, bad("no message ID")
	}
	op := p.Children[1]
	if op.ClassType != ber.ClassApplication {
		return nil, bad("no protocol operation")
	}
	m := &Message{ID: id, Op: opNames[op.Tag]}
	if m.Op == "" {
		m.Op = fmt.Sprintf("op-%d", op.Tag)
	}
	switch op.Tag {
	case ldap.ApplicationBindRequest:
		if len(op.Children) < 3 {
			return nil, bad("short BindRequest")
		}
		dn, ok := op.Children[1].Value.(string)
		if !ok {
			dn = string(op.Children[1].ByteValue)
		}
		m.BindDN = dn
		switch auth := op.Children[2]; {
		case auth.ClassType == ber.ClassContext && auth.Tag == 0:
			m.BindAuth = "simple"
			m.Anonymous = dn == ""
		case auth.ClassType == ber.ClassContext && auth.Tag == 3:
			m.BindAuth = "sasl"
		default:
			return nil, bad("unknown bind authentication")
		}
	case ldap.ApplicationExtendedRequest:
		if len(op.Children) > 0 && op.Children[0].ClassType == ber.ClassContext && op.Children[0].Tag == 0 {
			m.Extended = string(op.Children[0].Data.Bytes())
		}
	}
	return m, nil
}

// TenantRule finds the tenant in a bind DN: either the value of an RDN
// attribute (the first "o=" or "dc=" …, case-insensitive), or the first
// capture group of a regular expression.
type TenantRule struct {
	RDN   string
	Regex *regexp.Regexp
}

// NewTenantRule validates a rule: exactly one of rdn and pattern, and a
// pattern with one capture group.
func NewTenantRule(rdn, pattern string) (*TenantRule, error) {
	switch {
	case (rdn == "") == (pattern == ""):
		return nil, errors.New("tenant: give either an RDN attribute or a regular expression")
	case pattern != "":
		re, err := regexp.Compile(pattern)
		if err != nil {
			return nil, fmt.Errorf("tenant regexp %q: %v", pattern, err)
		}
		if re.NumSubexp() < 1 {
			return nil, fmt.Errorf("tenant regexp %q: needs a capture group", pattern)
		}
		return &TenantRule{Regex: re}, nil
	}
	return &TenantRule{RDN: strings.ToLower(rdn)}, nil
}

// Tenant returns the tenant named by dn, lower-cased, or false.
func (t *TenantRule) Tenant(dn string) (string, bool) {
	if t.Regex != nil {
		m := t.Regex.FindStringSubmatch(dn)
		if m == nil || m[1] == "" {
			return "", false
		}
		return strings.ToLower(m[1]), true
	}
	parsed, err := ldap.ParseDN(dn)
	if err != nil {
		return "", false
	}
	for _, rdn := range parsed.RDNs {
		for _, a := range rdn.Attributes {
			if strings.EqualFold(a.Type, t.RDN) && a.Value != "" {
				return strings.ToLower(a.Value), true
			}
		}
	}
	return "", false
}

// errorKeeper remembers the last error of the reader it wraps.
type errorKeeper struct {
	r   io.Reader
	err error
}

func (e *errorKeeper) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.err = err
	}
	return n, err
}
