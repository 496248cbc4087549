package tenantroute

import (
	"time"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

// Only authenticated connections count as load: each BindResponse the node
// sends says whether this one is (internal/placement.Lease), and each later
// bind the client sends on a connection that stopped counting must first be
// admitted on its node as a new connection is (admit, through
// countingGuard). A successful bind after a successful bind changes nothing
// and takes no lock: the relay calls onBind in the path of every
// BindResponse, and a rebind as the same user is common (pooled
// connections).

// accountFirst judges the answer connect read to the first message: true
// when that answer is the connection's last (max_failed_binds).
func (c *routedConn) accountFirst(first *ldapwire.Message) (last bool) {
	if c.up.bindResult >= 0 {
		return c.onBind(c.up.bindResult) != nil
	}
	if first.Op != "bind" {
		c.lease.Bound(true, time.Now()) // no bind to judge (tenant from a placeholder): counted
	}
	return false
}

// onBind takes the resultCode of each BindResponse the node sends;
// ErrLastAnswer closes the connection once the client has that answer.
func (c *routedConn) onBind(code int64) error {
	switch code {
	case ldapwire.ResultSuccess:
		c.lease.Bound(true, time.Now())
	case ldapwire.ResultSASLBindInProgress:
		c.lease.BindInProgress()
	default:
		c.lease.Bound(false, time.Now())
		failedBinds.WithLabelValues(c.t.Name).Inc()
		c.t.state.failed.Add(c.tenant)
		if c.failed++; c.failed >= c.t.MaxFailedBinds {
			failedBindCloses.WithLabelValues(c.t.Name).Inc()
			if ce := c.t.logger.Check(zap.InfoLevel, "closing a connection after max_failed_binds failed binds"); ce != nil {
				ce.Write(zap.String("tenant", c.tenant), zap.Int("failed_binds", c.failed), zap.String("remote", c.remote.String()))
			}
			return ldapwire.ErrLastAnswer // the client reads the answer, then the close
		}
	}
	return nil
}

// admit is the guard's Admit for a later bind with message ID id: the
// connection counts on its node again, or the bind goes to no node and the
// client is answered busy between two of the node's messages (refuse.go).
func (c *routedConn) admit(id int64) error {
	c.fromClient.countPassed() // the messages before the bind count as the connection counted when they passed
	if c.lease.Admit(time.Now()) == nil {
		return nil
	}
	busyRefusals.WithLabelValues(c.t.Name).Inc()
	if ce := c.t.logger.Check(zap.DebugLevel, "the connection's node is at max_per_node: bind refused busy"); ce != nil {
		ce.Write(zap.String("tenant", c.tenant), zap.String("node", c.lease.Node), zap.String("remote", c.remote.String()))
	}
	if err := c.toClient.answer(ldapwire.BindResponse(id, ldapwire.ResultBusy, busyMessage)); err != nil {
		return err
	}
	return ldapwire.ErrRefused
}
