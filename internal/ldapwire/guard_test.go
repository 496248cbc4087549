package ldapwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"
)

func searchRequest(id int64, base string) []byte {
	s := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationSearchRequest, nil, "Search Request")
	s.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, base, "Base DN"))
	return envelope(id, s)
}

// feed passes stream through g in chunks of n bytes as the relay does:
// what g keeps back comes again with the next chunk, and of a chunk g
// fails on, only the bytes before the failure (the messages Feed passed
// with its error) are passed. It returns what g let through.
func feed(g *TenantGuard, stream []byte, n int) ([]byte, error) {
	var passed, held []byte
	for len(stream) > 0 {
		k := min(n, len(stream))
		b := append(held, stream[:k]...)
		stream = stream[k:]
		fwd, err := g.Feed(b)
		passed = append(passed, b[:fwd]...) // passed on even with an error (relay.Filter)
		if err != nil {
			return passed, err
		}
		held = append([]byte(nil), b[fwd:]...)
	}
	return passed, nil
}

func guard() *TenantGuard {
	rule, _ := NewTenantRule("o", "")
	return &TenantGuard{Rule: rule, Tenant: "acme", MaxLen: 1 << 20}
}

// Whatever the chunking, the tenant's own binds and other messages (a long
// one passed in pieces) go through whole and unchanged; a bind to another
// tenant is refused with nothing of it passed.
func TestTenantGuard(t *testing.T) {
	long := searchRequest(3, "o=acme,"+strings.Repeat("x", 70000))
	ok := bytes.Join([][]byte{bindRequest(2, "uid=bob,o=ACME,dc=example", "pw"), long, searchRequest(4, "dc=example")}, nil)
	other := bindRequest(5, "uid=eve,o=globex,dc=example", "pw")
	for _, n := range []int{1, 2, 7, 100, 4096, len(ok) + len(other)} {
		passed, err := feed(guard(), ok, n)
		if err != nil || !bytes.Equal(passed, ok) {
			t.Fatalf("chunks of %d: passed %d of %d bytes: %v", n, len(passed), len(ok), err)
		}
		passed, err = feed(guard(), append(append([]byte(nil), ok...), other...), n)
		var rebind *RebindError
		if !errors.As(err, &rebind) || rebind.BindDN != "uid=eve,o=globex,dc=example" {
			t.Fatalf("chunks of %d: rebind to globex: %v", n, err)
		}
		if !bytes.HasPrefix(ok, passed) {
			t.Fatalf("chunks of %d: passed %d bytes, not only of the %d before the refused bind", n, len(passed), len(ok))
		}
	}
	// A bind is held back until it is whole: its start is not passed.
	g := guard()
	b := bindRequest(6, "uid=bob,o=acme,dc=example", "pw")
	if n, err := g.Feed(b[:len(b)-1]); n != 0 || err != nil {
		t.Fatalf("partial bind: passed %d: %v", n, err)
	}
	// An anonymous rebind names no tenant: refused too.
	if _, err := feed(guard(), bindRequest(7, "", ""), 3); !errors.As(err, new(*RebindError)) {
		t.Fatalf("anonymous rebind: %v", err)
	}
}

func TestTenantGuardRefusesMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"not a message":      []byte("GET / HTTP/1.1\r\n"),
		"indefinite length":  {0x30, 0x80, 0x02, 0x01, 0x01},
		"oversized":          searchRequest(1, strings.Repeat("x", 2<<20)),
		"no message ID":      {0x30, 0x03, 0x04, 0x01, 0x01},
		"ID past the end":    {0x30, 0x03, 0x02, 0x05, 0x01, 0x60, 0x00},
		"primitive bind":     {0x30, 0x05, 0x02, 0x01, 0x01, 0x40, 0x00},
		"TLS after StartTLS": {0x16, 0x03, 0x01, 0x00, 0x10},
	} {
		if _, err := feed(guard(), b, 4096); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Frame reads the envelope a byte at a time: ErrShort until the operation's
// tag has arrived, then the size, and bind for a BindRequest only.
func TestFrame(t *testing.T) {
	for _, tc := range []struct {
		msg  []byte
		bind bool
	}{
		{bindRequest(1, "o=acme", "x"), true},
		{searchRequest(300, strings.Repeat("y", 300)), false},
		{startTLS(70000), false},
	} {
		var size int
		var bind bool
		var err error
		for i := 0; i <= len(tc.msg); i++ {
			if size, bind, err = Frame(tc.msg[:i], DefaultMaxLength); err != ErrShort {
				break
			}
		}
		if err != nil || size != len(tc.msg) || bind != tc.bind {
			t.Errorf("%x…: size %d bind %v %v", tc.msg[:8], size, bind, err)
		}
	}
}

// FuzzTenantGuard: however a stream is chunked, no bind naming another
// tenant gets through, and binds only ever get through whole.
func FuzzTenantGuard(f *testing.F) {
	f.Add(append(bindRequest(1, "o=acme", "x"), bindRequest(2, "o=globex", "y")...), byte(3))
	f.Add(append(searchRequest(1, "o=acme"), bindRequest(2, "o=acme", "y")...), byte(1))
	// Rebinds with the accepted DN, then others: the guard's comparison
	// with the last accepted DN must not let another one through.
	f.Add(append(append(append(bindRequest(1, "uid=a,o=acme", "x"), bindRequest(2, "uid=a,o=acme", "x")...),
		bindRequest(3, "uid=a,o=acmex", "x")...), bindRequest(4, "uid=a,o=acme", "x")...), byte(40))
	f.Fuzz(func(t *testing.T, stream []byte, chunk byte) {
		g := guard()
		passed, _ := feed(g, stream, int(chunk)+1)
		begun := uint64(0) // messages whose start was passed
		defer func() {
			if !t.Failed() && g.Messages != begun {
				t.Fatalf("Messages %d, %d messages begun in the bytes passed", g.Messages, begun)
			}
		}()
		for len(passed) > 0 {
			size, bind, err := Frame(passed, 1<<20)
			if err != nil {
				t.Fatalf("passed bytes that do not start with a whole header: %v", err)
			}
			begun++
			if bind && size > len(passed) {
				t.Fatalf("part of a bind passed: %x", passed)
			}
			if size > len(passed) {
				return
			}
			if bind {
				m, err := Parse(passed[:size])
				if err != nil {
					t.Fatalf("a malformed bind passed: %v", err)
				}
				if tenant, _ := guard().Rule.Tenant(m.BindDN); tenant != "acme" {
					t.Fatalf("a bind as %q passed", m.BindDN)
				}
			}
			passed = passed[size:]
		}
	})
}

// A rebind with the DN accepted last is not parsed again: it allocates
// nothing (counted exactly: one AllocsPerRun run of 100 rebinds, whose
// average over the single run is the total). A different DN is still
// checked, whatever came before it.
func TestTenantGuardRebindSameDN(t *testing.T) {
	g := guard()
	alice := bindRequest(1, "uid=alice,o=acme,dc=example", "pw")
	if n, err := g.Feed(alice); n != len(alice) || err != nil {
		t.Fatalf("first rebind: %d %v", n, err)
	}
	if allocs := testing.AllocsPerRun(1, func() {
		for range 100 {
			if n, err := g.Feed(alice); n != len(alice) || err != nil {
				t.Fatalf("same rebind: %d %v", n, err)
			}
		}
	}); allocs != 0 {
		t.Fatalf("100 rebinds with the accepted DN: %v allocations", allocs)
	}
	bob := bindRequest(2, "uid=bob,O=ACME,dc=example", "pw")
	if n, err := g.Feed(bob); n != len(bob) || err != nil {
		t.Fatalf("another DN of the tenant: %d %v", n, err)
	}
	for _, dn := range []string{"uid=alice,o=other,dc=example", "o=x,uid=alice,o=acme,dc=example", ""} {
		evil := bindRequest(3, dn, "pw")
		var rebind *RebindError
		if n, err := g.Feed(evil); n != 0 || !errors.As(err, &rebind) || rebind.BindDN != dn {
			t.Fatalf("rebind to %q after accepted ones: %d %v", dn, n, err)
		}
	}
	if n, err := g.Feed(alice); n != len(alice) || err != nil {
		t.Fatalf("back to the first DN: %d %v", n, err)
	}
}
