package tenantroute

import (
	"fmt"
	"net"
	"syscall"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/relay"
)

// relay passes on the node's answer that connect began to read and relays
// both ways until the connection ends. Later messages are framed, and only
// BindRequests decoded, by the guard (keeping binds to rule); an idle
// connection holds no buffer (internal/relay). The ends the relay writes to
// are wrapped (refuse.go): a bind refused at admission goes to no node, and
// its answer to the client goes between two of the node's messages.
func (c *routedConn) relay(rule *ldapwire.TenantRule) error {
	cx, up, max := c.cx, c.up, int64(c.t.MaxMessageLength)
	if len(up.head) > 0 { // the node's answer has begun
		if _, err := cx.Write(up.head); err != nil {
			return c.finish(err)
		}
	}
	watcher := &ldapwire.BindWatcher{OnBind: c.onBind, MaxLen: max}
	if up.bindResult < 0 && len(up.head) > 0 {
		// The header of the answer to a first message that is not a
		// bind: the watcher frames the node's stream from its start.
		if n, err := watcher.Feed(up.head); err != nil || n != len(up.head) {
			return c.finish(fmt.Errorf("tenant_route: the node's first answer: %d of %d bytes framed: %v", n, len(up.head), err))
		}
	}
	c.toClient = &clientConn{wrapped: wrapped{Conn: cx}, watcher: watcher, inside: !watcher.Between()}
	c.fromClient = &countingGuard{guard: ldapwire.TenantGuard{Rule: rule, Tenant: c.tenant, MaxLen: max}, lease: c.lease}
	c.fromClient.guard.Admit = c.admit
	client := relay.End{Conn: c.toClient, Filter: c.fromClient}
	node2client := relay.End{Conn: &nodeConn{wrapped: wrapped{Conn: up.Conn}, guard: &c.fromClient.guard}, Filter: watcher}
	if c.handOver(client, node2client) {
		return nil // caddy-l4 closes its descriptor; the socket stays open through the relay's own
	}
	return c.pipe(client, node2client)
}

// handOver gives the bare socket, when nothing was read ahead of it, to the
// relay, and this handler returns: an idle connection holds no goroutine,
// nor caddy-l4's buffers (README "Idle connections"). False: the
// connection is not such a socket or the relay could not take it; nothing
// has changed.
func (c *routedConn) handOver(client, node2client relay.End) bool {
	sock, ok := c.cx.Conn.(*net.TCPConn)
	if !ok || len(c.cx.MatchingBytes()) != 0 {
		return false
	}
	own, err := relay.Own(sock)
	if err != nil {
		return false
	}
	c.toClient.Conn = own
	if relay.Start(client, node2client, func(err error) {
		own.Close()
		if err := c.finish(err); err != nil {
			c.t.logger.Error("handling connection", zap.String("remote", c.remote.String()), zap.Error(err))
		}
	}) {
		relays.WithLabelValues(c.t.Name, "handed_over").Inc()
		return true
	}
	own.Close()
	c.toClient.Conn = c.cx
	return false
}

// pipe relays in this handler's goroutine, through caddy-l4's connection.
func (c *routedConn) pipe(client, node2client relay.End) error {
	cx := c.cx
	client.Buffered = func() int { return len(cx.MatchingBytes()) } // bytes a matcher read ahead come first
	switch sc := cx.Conn.(type) {
	case *net.TCPConn:
		// The bare socket: cx adds only its read-ahead (Buffered), so
		// the relay reads the socket itself, one syscall per read.
		client.Socket, client.Direct = sc, true
		c.toClient.socket = sc
	case syscall.Conn:
		// A wrapper (proxy protocol, say) may hold bytes of its own:
		// wait on the socket, read through the wrapper.
		client.Socket = sc
		c.toClient.socket = sc
	}
	relays.WithLabelValues(c.t.Name, "in_place").Inc()
	return c.finish(relay.Pipe(client, node2client))
}
