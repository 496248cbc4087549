package ldapwire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"
)

func envelope(id int64, op *ber.Packet) []byte {
	p := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAP Request")
	p.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, id, "MessageID"))
	p.AppendChild(op)
	return p.Bytes()
}

func bindRequest(id int64, dn, password string) []byte {
	b := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationBindRequest, nil, "Bind Request")
	b.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 3, "Version"))
	b.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, dn, "User Name"))
	b.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 0, password, "Password"))
	return envelope(id, b)
}

func startTLS(id int64) []byte {
	e := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationExtendedRequest, nil, "Start TLS")
	e.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 0, StartTLSOID, "TLS Extended Command"))
	return envelope(id, e)
}

func TestReadBindAndStream(t *testing.T) {
	stream := append(bindRequest(1, "uid=alice,ou=people,o=Acme,dc=example,dc=com", "secret"), startTLS(2)...)
	r := bytes.NewReader(stream)
	m, err := Read(r, DefaultMaxLength)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 1 || m.Op != "bind" || m.BindAuth != "simple" || m.BindDN != "uid=alice,ou=people,o=Acme,dc=example,dc=com" || m.Anonymous {
		t.Fatalf("%+v", m)
	}
	if !bytes.Equal(m.Raw, stream[:len(m.Raw)]) {
		t.Fatal("raw bytes differ from the stream")
	}
	m2, err := Read(r, DefaultMaxLength)
	if err != nil || !m2.StartTLS() || m2.ID != 2 {
		t.Fatalf("StartTLS: %+v %v", m2, err)
	}
	if _, err := Read(r, DefaultMaxLength); err != io.EOF {
		t.Fatalf("end of stream: %v", err)
	}
	anon, _ := Parse(bindRequest(3, "", ""))
	if !anon.Anonymous {
		t.Fatal("anonymous bind not recognised")
	}
}

func TestTenantRules(t *testing.T) {
	dn := "uid=alice,ou=people,o=Acme,dc=example,dc=com"
	for _, tc := range []struct {
		rdn, re, want string
		ok            bool
	}{
		{"o", "", "acme", true},
		{"dc", "", "example", true},
		{"O", "", "acme", true},
		{"cn", "", "", false},
		{"", `,o=([^,]+),`, "acme", true},
		{"", `^uid=[^@]+@([a-z]+)`, "", false},
	} {
		rule, err := NewTenantRule(tc.rdn, tc.re)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := rule.Tenant(dn)
		if got != tc.want || ok != tc.ok {
			t.Errorf("rule %q/%q: %q %v", tc.rdn, tc.re, got, ok)
		}
	}
	for _, c := range [][2]string{{"", ""}, {"o", "x(.)"}, {"", "no-group"}, {"", "("}} {
		if _, err := NewTenantRule(c[0], c[1]); err == nil {
			t.Errorf("rule %q accepted", c)
		}
	}
}

func TestMalformedAndOversized(t *testing.T) {
	good := bindRequest(1, "o=acme", "x")
	for name, b := range map[string][]byte{
		"garbage":       []byte("GET / HTTP/1.1\r\n\r\n"),
		"truncated":     good[:len(good)-3],
		"not a message": ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 5, "x").Bytes(),
	} {
		if _, err := Read(bytes.NewReader(b), DefaultMaxLength); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	big := bindRequest(1, "o="+strings.Repeat("a", 5000), "x")
	if _, err := Read(bytes.NewReader(big), 1024); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "longer than 1024") {
		t.Errorf("oversized: %v", err)
	}
}

// FuzzRead feeds arbitrary bytes to the reader: no panic; what it accepts
// re-reads identically from its raw bytes.
func FuzzRead(f *testing.F) {
	f.Add(bindRequest(1, "uid=a,o=acme,dc=example", "pw"))
	f.Add(startTLS(7))
	f.Add(append(bindRequest(1, "", ""), bindRequest(2, "o=x", "y")...))
	f.Add([]byte{0x30, 0x84, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for range 8 {
			m, err := Read(r, 4096)
			if err != nil {
				return
			}
			again, err := Parse(m.Raw)
			if err != nil || again.Op != m.Op || again.BindDN != m.BindDN {
				t.Fatalf("re-read differs: %+v vs %+v (%v)", m, again, err)
			}
			rule, _ := NewTenantRule("o", "")
			rule.Tenant(m.BindDN)
		}
	})
}

// A reader's own error (say, "no more bytes buffered yet") comes back as
// is, not as malformed.
func TestReaderErrorsPassThrough(t *testing.T) {
	errWait := errors.New("wait for more")
	b := bindRequest(1, "o=acme", "x")
	r := io.MultiReader(bytes.NewReader(b[:5]), iotestErr{errWait})
	if _, err := Read(r, DefaultMaxLength); err != errWait {
		t.Fatalf("got %v", err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// berParse is the decoder Parse replaced, on go-asn1-ber: the reference
// for FuzzParseAgreesWithBer.
func berParse(b []byte) (*Message, error) {
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
	m := &Message{ID: id, Op: opNames[byte(op.Tag)]}
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
			m.Extended = op.Children[0].Data.String()
		}
	}
	return m, nil
}

// FuzzParseAgreesWithBer: where go-asn1-ber also decodes a message, Parse
// reads the same operation, ID, bind DN and authentication from it.
func FuzzParseAgreesWithBer(f *testing.F) {
	f.Add(bindRequest(1, "uid=a,o=acme,dc=example", "pw"))
	f.Add(bindRequest(-300, "", ""))
	f.Add(startTLS(7))
	f.Add([]byte{0x30, 0x05, 0x02, 0x01, 0x01, 0x42, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data)
		if err != nil {
			return
		}
		want, err := berParse(data)
		if err != nil {
			return
		}
		if got.ID != want.ID || got.Op != want.Op || got.BindDN != want.BindDN || got.BindAuth != want.BindAuth ||
			got.Anonymous != want.Anonymous || got.Extended != want.Extended {
			t.Fatalf("Parse %+v, go-asn1-ber %+v", got, want)
		}
	})
}

// The short-form fast paths of tagLength and element answer exactly as
// the general readers do, for every identifier and length octet, with the
// contents whole, cut short and followed by more.
func TestShortFormFastPaths(t *testing.T) {
	buf := make([]byte, 2+0x7f+2)
	for b0 := range 256 {
		for b1 := range 256 {
			buf[0], buf[1] = byte(b0), byte(b1)
			for _, n := range []int{0, 1, 2, 3, 2 + b1 - 1, 2 + b1, 2 + b1 + 2} {
				if n < 0 || n > len(buf) {
					continue
				}
				b := buf[:n]
				for _, want := range []byte{byte(b0), tagMessage} {
					h1, l1, e1 := tagLength(b, want)
					h2, l2, e2 := tagLengthLong(b, want)
					if h1 != h2 || l1 != l2 || (e1 == nil) != (e2 == nil) {
						t.Fatalf("tagLength(%x, %#x) = %d %d %v, tagLengthLong %d %d %v", b, want, h1, l1, e1, h2, l2, e2)
					}
				}
				t1, c1, r1, e1 := element(b)
				t2, c2, r2, e2 := elementLong(b)
				if t1 != t2 || !bytes.Equal(c1, c2) || !bytes.Equal(r1, r2) || len(c1) != len(c2) || len(r1) != len(r2) || (e1 == nil) != (e2 == nil) {
					t.Fatalf("element(%x) = %x %x %x %v, elementLong %x %x %x %v", b, t1, c1, r1, e1, t2, c2, r2, e2)
				}
			}
		}
	}
}
