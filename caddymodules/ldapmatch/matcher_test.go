package ldapmatch_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
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
		t.Helper()
		got, err := exchange(front, parts...)
		if err != nil {
			t.Fatal(err)
		}
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

// exchange dials addr, writes parts (50 ms apart, so each is its own TCP
// segment), half-closes and reads until the server closes. A refused dial,
// or a server that neither answers nor closes within 10 s, is an error, so
// "closed without an answer" cannot be mistaken for either.
func exchange(addr string, parts ...[]byte) ([]byte, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	for _, p := range parts {
		conn.Write(p)
		time.Sleep(50 * time.Millisecond)
	}
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return got, fmt.Errorf("%s neither answered nor closed the connection in 10 s", addr)
	}
	return got, nil
}

// tagServer accepts connections and answers each with tag, then closes:
// it shows which route a connection took.
func tagServer(t *testing.T, tag string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(tag))
			c.Close()
		}
	}()
	return l.Addr().String()
}

func envelope(op *ber.Packet) []byte {
	p := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAP Request")
	p.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, int64(1), "MessageID"))
	p.AppendChild(op)
	return p.Bytes()
}

func startTLSRequest() []byte {
	op := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationExtendedRequest, nil, "Extended Request")
	op.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 0, "1.3.6.1.4.1.1466.20037", "StartTLS"))
	return envelope(op)
}

func searchRequest() []byte {
	op := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationSearchRequest, nil, "Search Request")
	op.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, "dc=example", "Base DN"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, 0, "Scope"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, 0, "Deref"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 0, "Size Limit"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 0, "Time Limit"))
	op.AppendChild(ber.NewBoolean(ber.ClassUniversal, ber.TypePrimitive, ber.TagBoolean, false, "Types Only"))
	op.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 7, "objectClass", "Present"))
	op.AppendChild(ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "Attributes"))
	return envelope(op)
}

// The matcher's other conditions through bin/caddy, each route leading to
// its own tag server: a StartTLS request (starttls true), an anonymous bind
// (anonymous true), a bind DN matched by bind_dn_regexp, a search as the
// first message (operation search); any other bind goes to a catch-all
// bind route whose subroute tells binds apart by the {l4.ldap.bind_dn} and
// {l4.ldap.bind_auth} placeholders that the matcher set.
func TestMatcherConditionsThroughCaddy(t *testing.T) {
	tags := map[string]string{}
	for _, tag := range []string{"starttls", "anonymous", "regexp", "search", "carol", "simple"} {
		tags[tag] = tagServer(t, tag)
	}
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			@starttls ldap {
				starttls true
			}
			route @starttls {
				proxy %s
			}
			@anonymous ldap {
				operation bind
				anonymous true
			}
			route @anonymous {
				proxy %s
			}
			@globex ldap {
				bind_dn_regexp ^uid=[a-z]+,o=globex,
			}
			route @globex {
				proxy %s
			}
			@search ldap {
				operation search
			}
			route @search {
				proxy %s
			}
			@bind ldap {
				operation bind
			}
			route @bind {
				subroute {
					@carol vars {l4.ldap.bind_dn} uid=carol,o=initech,dc=example
					route @carol {
						proxy %s
					}
					@simple vars {l4.ldap.bind_auth} simple
					route @simple {
						proxy %s
					}
				}
			}
		}
	}
}`, front, tags["starttls"], tags["anonymous"], tags["regexp"], tags["search"], tags["carol"], tags["simple"]))
	c.WaitTCP(t, front)
	for name, tc := range map[string]struct {
		first []byte
		want  string
	}{
		"starttls":         {startTLSRequest(), "starttls"},
		"anonymous bind":   {bindRequest(""), "anonymous"},
		"globex by regexp": {bindRequest("uid=bob,o=globex,dc=example"), "regexp"},
		"search first":     {searchRequest(), "search"},
		"carol by bind_dn": {bindRequest("uid=carol,o=initech,dc=example"), "carol"},
		"other bind":       {bindRequest("uid=Bob,o=globex,dc=example"), "simple"},
	} {
		got, err := exchange(front, tc.first)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if string(got) != tc.want {
			t.Errorf("%s: reached %q, want %q", name, got, tc.want)
		}
	}
}
