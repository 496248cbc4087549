package tenantroute

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// tenant names the connection's tenant, from the Tenant placeholder or the
// first message's bind DN, and the rule later binds must keep to (nil: none).
func (t *TenantRoute) tenant(cx *layer4.Connection, first *ldapwire.Message) (string, *ldapwire.TenantRule, error) {
	if t.Tenant != "" {
		tenant := cx.Replacer().ReplaceAll(t.Tenant, "")
		if tenant == "" {
			return "", nil, fmt.Errorf("tenant_route: %s is empty for this connection", t.Tenant)
		}
		return tenant, nil, nil
	}
	if first.Op != "bind" || first.Anonymous {
		return "", nil, fmt.Errorf("tenant_route: first message is %s, not a named bind: route StartTLS and anonymous connections elsewhere", first.Op)
	}
	tenant, ok := t.rule.Tenant(first.BindDN)
	if !ok {
		return "", nil, fmt.Errorf("tenant_route: no tenant in bind DN %q", first.BindDN)
	}
	return tenant, t.rule, nil
}

// busyMessage is the diagnostic of a refusal at max_per_node.
const busyMessage = "every directory node of this tenant is at its connection limit; try again later"

// refuseBusy answers a connection whose tenant's nodes are all at
// max_per_node with LDAP busy (51): the client may try again later.
func (t *TenantRoute) refuseBusy(cx *layer4.Connection, tenant string, first *ldapwire.Message) {
	busyRefusals.WithLabelValues(t.Name).Inc()
	if ce := t.logger.Check(zap.DebugLevel, "every node of the tenant is at max_per_node: busy"); ce != nil {
		ce.Write(zap.String("tenant", tenant))
	}
	if first.Op == "bind" {
		cx.Write(ldapwire.BindResponse(first.ID, ldapwire.ResultBusy, busyMessage))
	} else {
		cx.Write(ldapwire.NoticeOfDisconnection(ldapwire.ResultBusy, busyMessage))
	}
}

// routedConn is a client connection routed to a node of its tenant, from
// the node's first answer to the connection's end.
type routedConn struct {
	t      *TenantRoute
	cx     *layer4.Connection
	tenant string
	lease  *placement.Lease // the reservation made by the pick: the connection's count on its node
	up     *upstream
	remote net.Addr
	failed int // failed binds so far, against max_failed_binds
	// The relay's client-side ends (handover.go), which admit uses.
	toClient   *clientConn
	fromClient *countingGuard
}

// route counts the connection as its tenant's on lease's node and says so
// in the placeholders, the metrics and the debug log.
func (t *TenantRoute) route(cx *layer4.Connection, tenant string, lease *placement.Lease, up *upstream) *routedConn {
	c := &routedConn{t: t, cx: cx, tenant: tenant, lease: lease, up: up, remote: cx.RemoteAddr()}
	t.state.connected.add(tenant, 1)
	routed.WithLabelValues(t.Name, lease.Node).Inc()
	repl := cx.Replacer()
	repl.Set("l4.tenant_route.tenant", tenant)
	repl.Set("l4.tenant_route.node", lease.Node)
	if ce := t.logger.Check(zap.DebugLevel, "routing"); ce != nil {
		ce.Write(zap.String("tenant", tenant), zap.String("node", lease.Node), zap.String("remote", c.remote.String()))
	}
	return c
}

// finish runs once the relay has ended (or could not start), and says what
// the connection's end was.
func (c *routedConn) finish(err error) error {
	c.up.Close()
	c.lease.Release(time.Now())
	c.t.state.connected.add(c.tenant, -1)
	if rebind := (*ldapwire.RebindError)(nil); errors.As(err, &rebind) {
		refusedRebinds.WithLabelValues(c.t.Name).Inc()
		c.t.logger.Warn("bind to another tenant on a routed connection: closing it",
			zap.String("tenant", c.tenant), zap.String("bind_dn", rebind.BindDN))
		return fmt.Errorf("tenant_route: %w", err)
	}
	if errors.Is(err, net.ErrClosed) || errors.Is(err, ldapwire.ErrLastAnswer) || errors.Is(err, errNoHalfClose) {
		return nil
	}
	return err
}
