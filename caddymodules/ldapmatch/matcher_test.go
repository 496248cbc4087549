package ldapmatch_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/caddymodules/ldapmatch"
	"github.com/edgesteer/edgesteer/internal/e2e"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func bindRequest(dn string) []byte {
	p := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAP Request")
	p.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, int64(1), "MessageID"))
	b := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationBindRequest, nil, "Bind Request")
	b.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 3, "Version"))
	b.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, dn, "User Name"))
	b.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 0, "pw", "Password"))
	p.AppendChild(b)
	return p.Bytes()
}

func TestUnmarshalCaddyfile(t *testing.T) {
	var m ldapmatch.MatchLDAP
	err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`ldap {
		operation bind search
		bind_dn *,o=acme,* *,o=globex,*
		bind_dn_regexp ^uid=
		anonymous false
		starttls false
	}`))
	if err != nil || len(m.Operations) != 2 || len(m.BindDNs) != 2 || m.BindDNRegexp != "^uid=" || *m.Anonymous || *m.StartTLS {
		t.Fatalf("%+v %v", m, err)
	}
	if err := new(ldapmatch.MatchLDAP).UnmarshalCaddyfile(caddyfile.NewTestDispenser("ldap {\ncolour blue\n}")); err == nil ||
		!strings.Contains(err.Error(), `unknown option "colour"`) {
		t.Fatalf("unknown option: %v", err)
	}
}

// Through bin/caddy: a bind for o=acme (its first message split over two
// TCP segments) matches and reaches the echo handler; another tenant's
// bind and a non-LDAP client match nothing and are closed.
func TestMatcherThroughCaddy(t *testing.T) {
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			@acme ldap {
				operation bind
				bind_dn *,o=acme,*
			}
			route @acme {
				echo
			}
		}
	}
}`, front))
	c.WaitTCP(t, front)
	send := func(parts ...[]byte) []byte {
		conn, err := net.Dial("tcp", front)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, p := range parts {
			conn.Write(p)
			time.Sleep(50 * time.Millisecond)
		}
		conn.(*net.TCPConn).CloseWrite()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(conn)
		return got
	}
	acme := bindRequest("uid=alice,ou=people,o=Acme,dc=example")
	if got := send(acme[:9], acme[9:]); string(got) != string(acme) {
		t.Fatalf("acme bind echoed %d bytes, want %d", len(got), len(acme))
	}
	if got := send(bindRequest("uid=bob,o=globex,dc=example")); len(got) != 0 {
		t.Fatalf("another tenant got %d bytes back", len(got))
	}
	if got := send([]byte("GET / HTTP/1.0\r\n\r\n")); len(got) != 0 {
		t.Fatalf("a non-LDAP client got %d bytes back", len(got))
	}
}
