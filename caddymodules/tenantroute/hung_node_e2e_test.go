package tenantroute_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// A node that accepts connections and never answers the bind: clients
// arriving together are each moved to the next node after at most one
// first_response_timeout, none fails; the node is counted
// (unanswered_total, one per connection it held), logged and cooled off,
// so later connections never reach it. A first message that must not be
// sent twice (an add, tenant from a placeholder) is not moved: the client
// gets a Notice of Disconnection (unavailable) and is closed.
func TestNodeThatNeverAnswers(t *testing.T) {
	addrs, names := startNodes(t, 2, ldifWithCandidates)
	hung, accepted := e2e.HangingListener(t, "127.0.0.1:0") // a hung slapd
	addrs = append(addrs, hung)
	// A tenant whose first node is the hung one.
	tenant := ""
	for _, c := range candidates() {
		if placement.Rank(c, addrs)[0] == hung {
			tenant = c
			break
		}
	}
	next := names[placement.Rank(tenant, addrs)[1]]
	// The writes listener names its tenant; one whose first node (k = 1)
	// is the hung one, so that a replay would reach node-1.
	front, writes := e2e.Addr(t), e2e.Addr(t)
	for placement.Rank(writes, []string{hung, addrs[0]})[0] != hung {
		writes = e2e.Addr(t)
	}
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			@bind ldap {
				operation bind
				anonymous false
			}
			route @bind {
				tenant_route {
					name ldap
					nodes %s
					partitions 2
					first_response_timeout 1s
					cool_off 10m
				}
			}
		}
		%s {
			route {
				tenant_route {
					name writes
					nodes %s
					partitions 1
					tenant {l4.conn.local_addr}
					first_response_timeout 1s
				}
			}
		}
	}
}`, front, strings.Join(addrs, " "), writes, hung+" "+addrs[0]))
	c.WaitTCP(t, front)
	c.WaitTCP(t, writes)
	baseline := accepted.Load() // WaitTCP's own connections go to Caddy, not here; 0

	// 20 clients of the tenant connect, then all bind at once.
	const n = 20
	conns := make([]*ldap.Conn, n)
	for i := range conns {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetTimeout(30 * time.Second)
		conns[i] = conn
	}
	answered := make([]string, n)
	e2e.Together(len(conns), func(i int) {
		conn := conns[i]
		if err := conn.Bind("uid=alice,o="+tenant+",dc=example", "pw-"+tenant); err != nil {
			t.Errorf("bind %d: %v", i, err)
			return
		}
		answered[i], _ = searchOn(conn)
	})
	if t.Failed() {
		t.FailNow()
	}
	for i, node := range answered {
		if node != next {
			t.Fatalf("client %d answered by %q, want the next node %s", i, node, next)
		}
	}
	held := accepted.Load() - baseline
	unans, _ := c.Metric(t, `caddy_edgesteer_tenant_route_unanswered_total{handler="ldap",node="`+hung+`"}`)
	if held < 1 || float64(held) != unans {
		t.Fatalf("the hung node held %d connections, unanswered_total %v: want equal and at least 1", held, unans)
	}
	t.Logf("%d of %d simultaneous clients waited on the hung node, then moved", held, n)
	c.WaitLog(t, "node did not answer the first message: cooling off", 5*time.Second)

	// Cooled off: later connections go straight to the next node.
	for range 5 {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		if got := marker(t, conn, tenant); got != next {
			t.Fatalf("after the cool-off began %s reached %s", tenant, got)
		}
		conn.Close()
	}
	if got := accepted.Load() - baseline; got != held {
		t.Fatalf("the cooled-off node got %d more connections", got-held)
	}

	// An AddRequest first (tenant from the listener): not sent twice, so
	// not to node-1 when the hung node does not answer.
	conn, err := net.Dial("tcp", writes)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	add := ldap.NewAddRequest("cn=x,dc=example", nil)
	add.Attribute("objectClass", []string{"organizationalRole"})
	add.Attribute("cn", []string{"x"})
	env := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "")
	env.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 1, ""))
	env.AppendChild(addPacket(add))
	if _, err := conn.Write(env.Bytes()); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	notice, err := ldapwire.Read(conn, 4096)
	if err != nil {
		t.Fatalf("no notice of disconnection: %v", err)
	}
	if notice.ID != 0 || notice.Op != "extended_response" || noticeName(t, notice.Raw) != ldapwire.NoticeOfDisconnectionOID {
		t.Fatalf("got %+v, want a notice of disconnection", notice)
	}
	if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection not closed after the notice: %v", err)
	}
	if w, _ := c.Metric(t, `caddy_edgesteer_tenant_route_unanswered_total{handler="writes"`); w != 1 {
		t.Fatalf("writes: unanswered_total %v, want 1", w)
	}
}

// addPacket encodes an AddRequest's protocolOp (go-ldap keeps its encoder
// unexported).
func addPacket(req *ldap.AddRequest) *ber.Packet {
	p := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationAddRequest, nil, "")
	p.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, req.DN, ""))
	attrs := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "")
	for _, a := range req.Attributes {
		attr := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "")
		attr.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, a.Type, ""))
		vals := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSet, nil, "")
		for _, v := range a.Vals {
			vals.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, v, ""))
		}
		attr.AppendChild(vals)
		attrs.AppendChild(attr)
	}
	p.AppendChild(attrs)
	return p
}

// noticeName returns an ExtendedResponse's responseName and checks its
// result code is unavailable.
func noticeName(t *testing.T, raw []byte) string {
	p, err := ber.DecodePacketErr(raw)
	if err != nil || len(p.Children) != 2 || len(p.Children[1].Children) < 4 {
		t.Fatalf("notice %x: %v", raw, err)
	}
	op := p.Children[1]
	if code, _ := op.Children[0].Value.(int64); code != ldapwire.ResultUnavailable {
		t.Fatalf("notice result code %v, want unavailable", op.Children[0].Value)
	}
	return op.Children[3].Data.String()
}
