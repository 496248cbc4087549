package tenantroute

import (
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// upstream is a connection to a node that has taken the client's first
// message and started answering it.
type upstream struct {
	net.Conn
	head []byte // the answer's first byte, read while waiting for it
}

// errNoAnswer: the node accepted the connection and the first message but
// sent nothing back within first_response_timeout (a hung slapd, say).
var errNoAnswer = errors.New("no answer to the first message")

// connect finds the tenant a node that takes the first message:
// placement.Connect reserves a node as it picks it; a node that cannot be
// dialled, or does not start answering the first message within
// FirstResponseTimeout, cools off and the next is tried. A first message
// that is not Replayable is sent to one node only: if that node does not
// answer, the connection fails.
func (t *TenantRoute) connect(tenant string, first *ldapwire.Message) (string, *upstream, error) {
	dialTimeout, answerTimeout := time.Duration(t.DialTimeout), time.Duration(t.FirstResponseTimeout)
	node, up, err := placement.Connect(t.placer, tenant, time.Duration(t.CoolOff),
		func(node string) (*upstream, error) {
			conn, err := net.DialTimeout("tcp", node, dialTimeout)
			if err != nil {
				return nil, err
			}
			up := &upstream{Conn: conn}
			if err := up.forwardFirst(first, answerTimeout); err != nil {
				conn.Close()
				return nil, err
			}
			return up, nil
		},
		func(node string, err error) {
			if errors.Is(err, errNoAnswer) {
				unanswered.WithLabelValues(t.Name, node).Inc()
				t.logger.Warn("node did not answer the first message: cooling off", zap.String("node", node),
					zap.String("tenant", tenant), zap.String("operation", first.Op), zap.Error(err))
				return
			}
			dialFailures.WithLabelValues(t.Name, node).Inc()
			t.logger.Warn("node unreachable: cooling off", zap.String("node", node), zap.Error(err))
		})
	if err != nil {
		return "", nil, fmt.Errorf("tenant_route: no node took the connection of tenant %s: %w", tenant, err)
	}
	return node, up, nil
}

// forwardFirst sends the first message and, if it expects an answer, waits
// up to timeout for the answer's first byte. A node that closes the
// connection instead has answered too (the relay passes the close on): only
// silence marks a node as failed.
func (up *upstream) forwardFirst(first *ldapwire.Message, timeout time.Duration) error {
	up.SetDeadline(time.Now().Add(timeout))
	defer up.SetDeadline(time.Time{})
	noRetry := func(err error) error {
		if first.Replayable() {
			return err
		}
		return fmt.Errorf("%w (%w: %s)", err, placement.ErrNoRetry, first.Op)
	}
	if _, err := up.Write(first.Raw); err != nil {
		return noRetry(err)
	}
	if !first.ExpectsResponse() {
		return nil
	}
	var b [1]byte
	n, err := up.Read(b[:])
	if n == 1 {
		up.head = []byte{b[0]}
		return nil
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return noRetry(fmt.Errorf("%w within %v", errNoAnswer, timeout))
	}
	return nil
}
