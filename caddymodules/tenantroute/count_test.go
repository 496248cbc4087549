package tenantroute

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	ber "github.com/go-asn1-ber/asn1-ber"
	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// message encodes an LDAPMessage with id and op.
func message(id int64, op *ber.Packet) []byte {
	p := ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "LDAP Request")
	p.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, id, "MessageID"))
	p.AppendChild(op)
	return p.Bytes()
}

func searchMsg(id int64, filter string) []byte {
	req := ldap.NewSearchRequest("o=acme,dc=example", ldap.ScopeWholeSubtree, 0, 0, 0, false, filter, nil, nil)
	op := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationSearchRequest, nil, "Search")
	op.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, req.BaseDN, "base"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, 2, "scope"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagEnumerated, 0, "deref"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 0, "size"))
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 0, "time"))
	op.AppendChild(ber.NewBoolean(ber.ClassUniversal, ber.TypePrimitive, ber.TagBoolean, false, "types"))
	f, _ := ldap.CompileFilter(filter)
	op.AppendChild(f)
	op.AppendChild(ber.Encode(ber.ClassUniversal, ber.TypeConstructed, ber.TagSequence, nil, "attrs"))
	return message(id, op)
}

func bindMsg(id int64, dn string) []byte {
	op := ber.Encode(ber.ClassApplication, ber.TypeConstructed, ldap.ApplicationBindRequest, nil, "Bind")
	op.AppendChild(ber.NewInteger(ber.ClassUniversal, ber.TypePrimitive, ber.TagInteger, 3, "version"))
	op.AppendChild(ber.NewString(ber.ClassUniversal, ber.TypePrimitive, ber.TagOctetString, dn, "dn"))
	op.AppendChild(ber.NewString(ber.ClassContext, ber.TypePrimitive, 0, "secret", "password"))
	return message(id, op)
}

// feedAll runs a stream through the filter in random pieces, as a relay
// does (unpassed bytes are fed again with the next piece), and returns the
// bytes passed and the error that stopped it.
func feedAll(f *countingGuard, stream []byte, r *rand.Rand) ([]byte, error) {
	var passed, held []byte
	for len(stream) > 0 || len(held) > 0 {
		k := min(len(stream), 1+r.IntN(40))
		held = append(held, stream[:k]...)
		stream = stream[k:]
		n, err := f.Feed(held)
		passed = append(passed, held[:n]...)
		held = held[n:]
		if err != nil {
			return passed, err
		}
		if k == 0 {
			break
		}
	}
	return passed, nil
}

// Every client message after the first counts once toward the tenant's
// rate, however the stream is cut into reads, including binds to the same
// tenant; a refused rebind stops the count with the stream.
func TestCountingGuardCountsMessages(t *testing.T) {
	p, _ := placement.New(2)
	p.SetNodes([]string{"n1:389", "n2:389", "n3:389"})
	if err := p.SetLimits(&placement.Auto{TargetRequestsPerNode: 1e9, CoolDown: time.Minute}, 0); err != nil {
		t.Fatal(err)
	}
	lease, err := p.Acquire("acme", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lease.Bound(true, time.Now())
	other, _ := p.Acquire("acme", time.Now()) // keeps the tenant's load tracked throughout
	other.Bound(true, time.Now())
	rule, err := ldapwire.NewTenantRule("o", "")
	if err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	const msgs = 300
	for i := range int64(msgs) {
		switch {
		case i%50 == 7:
			stream.Write(bindMsg(i+2, "uid=u,o=acme,dc=example"))
		case i%30 == 11: // long-form lengths: 2 and 3 octets
			stream.Write(searchMsg(i+2, "(description="+strings.Repeat("x", 300+int(i)*200)+")"))
		default:
			stream.Write(searchMsg(i+2, "(uid=user-"+string(rune('a'+i%26))+")"))
		}
	}
	stream.Write(bindMsg(999, "uid=u,o=globex,dc=example")) // refused
	stream.Write(searchMsg(1000, "(uid=x)"))
	r := rand.New(rand.NewPCG(1, 2))
	f := &countingGuard{guard: ldapwire.TenantGuard{Rule: rule, Tenant: "acme", MaxLen: 1 << 16}, lease: lease}
	now := time.Now()
	p.Tick(now)
	passed, err := feedAll(f, stream.Bytes(), r)
	var rebind *ldapwire.RebindError
	if !errors.As(err, &rebind) {
		t.Fatalf("err %v, want the rebind refused", err)
	}
	if !bytes.Equal(passed, stream.Bytes()[:len(passed)]) || len(passed) >= stream.Len() {
		t.Fatalf("passed %d of %d bytes", len(passed), stream.Len())
	}
	p.Tick(now.Add(time.Second))
	if got := p.Loads()["acme"].RequestsPerSecond; got != msgs {
		t.Fatalf("%v requests counted, want %d", got, msgs)
	}
	// Once the bind fails, the connection's messages count no more.
	lease.Bound(false, now)
	if n, err := f.Feed(searchMsg(5, "(uid=y)")); n == 0 || err != nil {
		t.Fatalf("a search after a failed bind: %d bytes passed, %v", n, err)
	}
	lease.Bound(true, now)
	p.Tick(now.Add(2 * time.Second))
	if got := p.Loads()["acme"].RequestsPerSecond; got != 0 {
		t.Fatalf("%v requests counted while unauthenticated", got)
	}
}

// Counting allocates nothing.
func TestCountingGuardAllocatesNothing(t *testing.T) {
	p, _ := placement.New(1)
	p.SetNodes([]string{"n1:389"})
	lease, _ := p.Acquire("acme", time.Now())
	lease.Bound(true, time.Now())
	f := &countingGuard{guard: ldapwire.TenantGuard{Tenant: "acme", MaxLen: 1 << 16}, lease: lease}
	b := bytes.Repeat(searchMsg(2, "(uid=a)"), 20)
	if n := testing.AllocsPerRun(1, func() { // one run of 200: the exact count, not a rounded average
		for range 200 {
			if n, err := f.Feed(b); n != len(b) || err != nil {
				panic(err)
			}
		}
	}); n != 0 {
		t.Fatalf("%v allocations in 200 Feeds", n)
	}
}

// The cost of counting: Feed of a read holding 20 small search requests,
// the guard alone (the anchor) against the guard with counting.
func BenchmarkGuardFeed(b *testing.B) {
	p, _ := placement.New(1)
	p.SetNodes([]string{"n1:389"})
	lease, _ := p.Acquire("acme", time.Now())
	lease.Bound(true, time.Now())
	buf := bytes.Repeat(searchMsg(2, "(uid=a)"), 20)
	b.Run("guard", func(b *testing.B) {
		g := &ldapwire.TenantGuard{Tenant: "acme", MaxLen: 1 << 16}
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			g.Feed(buf)
		}
	})
	b.Run("guard+count", func(b *testing.B) {
		f := &countingGuard{guard: ldapwire.TenantGuard{Tenant: "acme", MaxLen: 1 << 16}, lease: lease}
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			f.Feed(buf)
		}
	})
}
