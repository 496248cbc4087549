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

	// Messages counts the messages begun in the bytes Feed has passed
	// (a message's header is passed only once it is whole and valid).
	Messages uint64

	rest     int    // bytes of the current message still to pass
	accepted []byte // the last bind DN found to name Tenant: a rebind with it is not parsed again
}

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
		if bind && g.Rule != nil {
			if len(b)-i < size {
				return i, nil
			}
			if err := g.checkBind(b[i : i+size]); err != nil {
				return i, err
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
