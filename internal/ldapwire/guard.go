package ldapwire

import (
	"bytes"
	"errors"
	"fmt"
)

// A TenantGuard watches what a client sends on a connection routed to its
// tenant's node, after the first bind: a BindRequest naming another tenant
// (or none) is refused before any byte of it is passed on. Only
// BindRequests are decoded; other messages are framed by their envelope and
// passed as they arrive, a large one in as many pieces as it came in.
type TenantGuard struct {
	Rule *TenantRule // nil: binds are not checked, only framed

	Tenant string
	MaxLen int64

	// Admit, if set, is asked about each BindRequest, held whole (and,
	// with Rule, found to name Tenant), with its message ID, before any
	// byte of it is passed: nil lets it through; ErrRefused refuses it:
	// its bytes count as passed by Feed but are listed in Refused, to be
	// left out of what goes to the node (the caller answers the client);
	// any other error stops Feed as a malformed message does.
	Admit func(id int64) error
	// Refused lists, after each Feed, the spans of the bytes it passed
	// that hold refused binds (offsets into the b Feed was given).
	Refused []Span

	// Messages counts the messages begun in the bytes Feed has passed
	// (a message's header is passed only once it is whole and valid),
	// refused binds not included.
	Messages uint64

	rest     int    // bytes of the current message still to pass
	accepted []byte // the last bind DN found to name Tenant: a rebind with it is not parsed again
}

// A Span is the bytes [Start, End) of a Feed's input.
type Span struct{ Start, End int }

// ErrRefused, from a TenantGuard's Admit, refuses a bind without ending the
// connection.
var ErrRefused = errors.New("ldapwire: bind refused")

// RebindError is a BindRequest on a routed connection that does not name
// its tenant.
type RebindError struct{ Tenant, BindDN string }

func (e *RebindError) Error() string {
	return fmt.Sprintf("rebind from tenant %s to %q refused", e.Tenant, e.BindDN)
}

// Feed takes the next bytes from the client and returns how many of them
// may be passed on now. The rest (a message header, or a BindRequest, not
// yet complete) is to be fed again with the bytes that follow it. A
// malformed or oversized message is ErrMalformed, a bind to another tenant
// a *RebindError; nothing more may be passed after either.
func (g *TenantGuard) Feed(b []byte) (int, error) {
	i := 0
	g.Refused = g.Refused[:0]
	for i < len(b) {
		if g.rest > 0 {
			k := min(g.rest, len(b)-i)
			i += k
			g.rest -= k
			continue
		}
		size, bind, err := Frame(b[i:], g.MaxLen)
		if errors.Is(err, ErrShort) {
			return i, nil
		}
		if err != nil {
			return i, err
		}
		if bind && (g.Rule != nil || g.Admit != nil) {
			if len(b)-i < size {
				return i, nil
			}
			if g.Rule != nil {
				if err := g.checkBind(b[i : i+size]); err != nil {
					return i, err
				}
			}
			if g.Admit != nil {
				id, _, _, err := splitMessage(b[i : i+size])
				if err != nil {
					return i, err
				}
				if err := g.Admit(integer(id)); errors.Is(err, ErrRefused) {
					g.Refused = append(g.Refused, Span{i, i + size})
					i += size
					continue
				} else if err != nil {
					return i, err
				}
			}
		}
		g.rest = size
		g.Messages++
	}
	return i, nil
}

// checkBind refuses a BindRequest (held whole in b) whose DN does not name
// the tenant. A client rebinding with the DN it bound with last costs a
// comparison: the DN is parsed (github.com/go-ldap/ldap's ParseDN, some
// twenty allocations) only when it changes.
func (g *TenantGuard) checkBind(b []byte) error {
	dn, err := bindDN(b)
	if err != nil {
		return err
	}
	if g.accepted != nil && bytes.Equal(dn, g.accepted) {
		return nil
	}
	if tenant, ok := g.Rule.Tenant(string(dn)); !ok || tenant != g.Tenant {
		return &RebindError{Tenant: g.Tenant, BindDN: string(dn)}
	}
	g.accepted = append(g.accepted[:0], dn...)
	return nil
}
