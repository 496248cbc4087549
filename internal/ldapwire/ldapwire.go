// Package ldapwire reads LDAP messages (RFC 4511) off a stream for a
// tenant router: it frames each LDAPMessage, names its operation, and takes
// a BindRequest's DN apart to find the tenant (DNs parsed by
// github.com/go-ldap/ldap). It knows nothing of Caddy.
//
// The envelope decoder is a small strict one rather than go-asn1-ber,
// which was the first choice: go-asn1-ber builds a packet tree per message
// (about 1.7 KiB of garbage for each connection's bind), which alone kept
// the router over its 16 KiB per idle connection budget. go-asn1-ber stays
// the reference: FuzzParseAgreesWithBer checks that both decoders agree.
package ldapwire

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

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

// opNames names operations by their application tag number.
var opNames = map[byte]string{
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

// Read reads one LDAPMessage of at most maxLen bytes from r, and no byte
// more. An EOF before the first byte is io.EOF; an error of r itself
// (other than EOF) comes back unchanged, so a caller can tell "wait for
// more bytes" from bad bytes; anything else wrong is ErrMalformed.
//
// It reads the envelope's header, then the rest in one piece: three reads
// at most, where decoding from r would read a byte at a time.
func Read(r io.Reader, maxLen int64) (*Message, error) {
	var head [2 + maxLengthOctets]byte
	if _, err := io.ReadFull(r, head[:2]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, truncated(err)
	}
	n := 2
	if k := int(head[1] &^ 0x80); head[1] > 0x80 && k <= maxLengthOctets {
		if _, err := io.ReadFull(r, head[2:2+k]); err != nil {
			return nil, truncated(err)
		}
		n += k
	}
	hdr, length, err := tagLength(head[:n], tagMessage)
	if err != nil {
		return nil, err
	}
	if int64(hdr)+int64(length) > maxLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, maxLen)
	}
	raw := make([]byte, hdr+length)
	copy(raw, head[:hdr])
	if _, err := io.ReadFull(r, raw[hdr:]); err != nil {
		return nil, truncated(err)
	}
	return Parse(raw)
}

// truncated passes r's own errors through and calls an early EOF
// malformed.
func truncated(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: truncated", ErrMalformed)
	}
	return err
}

// ErrShort means the bytes end before a message's header does.
var ErrShort = errors.New("LDAP message header incomplete")

const (
	tagMessage         = 0x30 // universal, constructed SEQUENCE: LDAPMessage
	tagMessageID       = 0x02 // universal INTEGER
	tagOctetString     = 0x04 // universal OCTET STRING
	tagBindRequest     = 0x60 // application 0, constructed
	tagExtendedRequest = 0x77 // application 23, constructed
	maxLengthOctets    = 4    // longer length fields are refused: no message is that long
)

// Frame reads the header of the LDAPMessage at the start of b without
// decoding the message: its size in bytes (at most maxLen), and whether
// its protocolOp is a BindRequest. It frames as slapd does (liblber's
// ber_get_next: SEQUENCE tag, definite length; then the INTEGER message ID
// and the protocolOp's tag), so a message it passes over is the message
// the node reads. ErrShort asks for more bytes.
func Frame(b []byte, maxLen int64) (size int, bind bool, err error) {
	size, op, err := frameOp(b, maxLen)
	// Constructed or not: anything a decoder could take for a BindRequest
	// is inspected.
	return size, err == nil && op|0x20 == tagBindRequest, err
}

// frameOp is Frame, returning the protocolOp's tag.
func frameOp(b []byte, maxLen int64) (size int, op byte, err error) {
	hdr, length, err := tagLength(b, tagMessage)
	if err != nil {
		return 0, 0, err
	}
	if int64(hdr)+int64(length) > maxLen {
		return 0, 0, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, maxLen)
	}
	size = hdr + length
	idHdr, idLen, err := tagLength(b[hdr:], tagMessageID)
	if err != nil {
		return 0, 0, err
	}
	at := hdr + idHdr + idLen
	switch {
	case at >= size:
		return 0, 0, fmt.Errorf("%w: no protocol operation", ErrMalformed)
	case at >= len(b):
		return 0, 0, ErrShort
	case b[at]&0xc0 != 0x40:
		return 0, 0, fmt.Errorf("%w: no protocol operation", ErrMalformed)
	}
	return size, b[at], nil
}

// tagLength reads a one-byte identifier, which must be want, and a
// definite length: the header's size and the length it gives. The short
// form (a length below 128, most elements) is read inline at the call;
// the rest, and every error, out of line.
func tagLength(b []byte, want byte) (hdr, length int, err error) {
	if len(b) >= 2 && b[0] == want && b[1] < 0x80 {
		return 2, int(b[1]), nil
	}
	return tagLengthLong(b, want)
}

func tagLengthLong(b []byte, want byte) (hdr, length int, err error) {
	switch {
	case len(b) == 0:
		return 0, 0, ErrShort
	case b[0] != want:
		return 0, 0, fmt.Errorf("%w: tag %#x where %#x belongs", ErrMalformed, b[0], want)
	case len(b) == 1:
		return 0, 0, ErrShort
	case b[1] < 0x80:
		return 2, int(b[1]), nil
	}
	k := int(b[1] &^ 0x80)
	if k == 0 || k > maxLengthOctets {
		return 0, 0, fmt.Errorf("%w: indefinite or oversized length", ErrMalformed)
	}
	if len(b) < 2+k {
		return 0, 0, ErrShort
	}
	for _, c := range b[2 : 2+k] {
		length = length<<8 | int(c)
	}
	return 2 + k, length, nil
}

// Parse decodes one complete LDAPMessage held in b (and nothing after
// it): the envelope, and of the operation what a router needs. It reads
// the BER itself, allocating little (a Message, a bind DN): a router does
// this once a connection and on every later bind. It is strict where a
// general decoder is lenient (one-byte tags, definite lengths that nest),
// so what it accepts, a node reads the same way.
func Parse(b []byte) (*Message, error) {
	id, tag, op, err := splitMessage(b)
	if err != nil {
		return nil, err
	}
	m := &Message{ID: integer(id), Op: opNames[tag&0x1f], Raw: b}
	if m.Op == "" {
		m.Op = fmt.Sprintf("op-%d", tag&0x1f)
	}
	switch tag {
	case tagBindRequest, tagBindRequest &^ 0x20:
		name, auth, err := bindFields(tag, op)
		if err != nil {
			return nil, err
		}
		m.BindDN = string(name)
		m.BindAuth = auth
		m.Anonymous = auth == "simple" && m.BindDN == ""
	case tagExtendedRequest:
		if t, name, _, err := element(op); err == nil && t == 0x80 {
			m.Extended = string(name)
		}
	}
	return m, nil
}

// splitMessage takes the LDAPMessage held whole in b apart: its message ID's
// contents, and its protocolOp's tag and contents. It allocates nothing
// but the error.
func splitMessage(b []byte) (id []byte, tag byte, op []byte, err error) {
	bad := func(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }
	tag, body, rest, err := element(b)
	if err != nil || tag != tagMessage || len(rest) > 0 {
		return nil, 0, nil, bad("not an LDAPMessage sequence")
	}
	tag, id, body, err = element(body)
	if err != nil || tag != tagMessageID || len(id) == 0 || len(id) > 8 {
		return nil, 0, nil, bad("no message ID")
	}
	tag, op, _, err = element(body) // controls may follow
	if err != nil || tag&0xc0 != 0x40 {
		return nil, 0, nil, bad("no protocol operation")
	}
	return id, tag, op, nil
}

// bindFields reads a BindRequest's contents (tag is its identifier): the
// name (DN) and the authentication choice, "simple" or "sasl".
func bindFields(tag byte, op []byte) (name []byte, auth string, err error) {
	bad := func(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }
	if tag != tagBindRequest {
		return nil, "", bad("short BindRequest")
	}
	var version []byte
	var vt, nt, at byte
	vt, version, op, err = element(op)
	if err == nil {
		nt, name, op, err = element(op)
	}
	if err == nil {
		at, _, _, err = element(op)
	}
	if err != nil || vt != tagMessageID || len(version) == 0 || nt != tagOctetString {
		return nil, "", bad("short BindRequest")
	}
	switch at &^ 0x20 { // primitive or constructed
	case 0x80:
		return name, "simple", nil
	case 0x83:
		return name, "sasl", nil
	}
	return nil, "", bad("unknown bind authentication")
}

// bindDN is the DN of the BindRequest held whole in b, checked as Parse
// checks it, without allocating (but for an error).
func bindDN(b []byte) ([]byte, error) {
	_, tag, op, err := splitMessage(b)
	if err != nil {
		return nil, err
	}
	name, _, err := bindFields(tag, op)
	return name, err
}

// element reads the BER element at the start of b: its (one-byte)
// identifier, its contents, and the bytes after it. As with tagLength, the
// short form is read inline.
func element(b []byte) (tag byte, contents, rest []byte, err error) {
	if len(b) >= 2 && b[0]&0x1f != 0x1f && b[1] < 0x80 && int(b[1]) <= len(b)-2 {
		n := 2 + int(b[1])
		return b[0], b[2:n], b[n:], nil
	}
	return elementLong(b)
}

func elementLong(b []byte) (tag byte, contents, rest []byte, err error) {
	if len(b) == 0 || b[0]&0x1f == 0x1f {
		return 0, nil, nil, ErrMalformed
	}
	hdr, n, err := tagLength(b, b[0])
	if err != nil || n > len(b)-hdr {
		return 0, nil, nil, ErrMalformed
	}
	return b[0], b[hdr : hdr+n], b[hdr+n:], nil
}

// integer decodes a BER INTEGER's contents (two's complement, big-endian,
// at most 8 bytes).
func integer(b []byte) int64 {
	v := int64(int8(b[0]))
	for _, c := range b[1:] {
		v = v<<8 | int64(c)
	}
	return v
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
