package tenantroute

import (
	"errors"
	"fmt"
	"math"
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
	// head is what was read of the answer while waiting for it: the whole
	// BindResponse to a first bind, else the header of the answer's first
	// message.
	head []byte
	// bindResult is that BindResponse's resultCode (-1: not a bind).
	bindResult int64
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
func (t *TenantRoute) connect(tenant string, first *ldapwire.Message) (*placement.Lease, *upstream, error) {
	dialTimeout, answerTimeout := time.Duration(t.DialTimeout), time.Duration(t.FirstResponseTimeout)
	lease, up, err := placement.Connect(t.placer, tenant, time.Duration(t.CoolOff),
		func(node string) (*upstream, error) {
			if w := t.state.watcher.Load(); w != nil {
				// Published before the dial: the node is named in the
				// tenant's assignment (with k as auto partitions may just
				// have grown it) before the tenant's connection reaches it.
				w.publish(tenant)
			}
			conn, err := net.DialTimeout("tcp", node, dialTimeout)
			if err != nil {
				return nil, err
			}
			up := &upstream{Conn: conn, bindResult: -1}
			if err := up.forwardFirst(first, answerTimeout, int64(t.MaxMessageLength)); err != nil {
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
		return nil, nil, fmt.Errorf("tenant_route: no node took the connection of tenant %s: %w", tenant, err)
	}
	return lease, up, nil
}

// forwardFirst sends the first message and, if it expects an answer, waits
// up to timeout for the answer: a bind's whole BindResponse (at most maxLen
// bytes: the bind's outcome decides whether the connection counts as
// load), any other message's first byte. A node that closes the connection
// instead has answered too (the relay passes the close on): only silence
// marks a node as failed.
func (up *upstream) forwardFirst(first *ldapwire.Message, timeout time.Duration, maxLen int64) error {
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
	if first.Op == "bind" {
		resp, err := ldapwire.Read(up, maxLen)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return noRetry(fmt.Errorf("%w within %v", errNoAnswer, timeout))
		}
		if err != nil {
			return nil // closed or garbled: the relay passes what follows on
		}
		up.head = resp.Raw
		if code, ok := ldapwire.BindResult(resp.Raw); ok {
			up.bindResult = code
		}
		return nil
	}
	// The answer's header, read a byte at a time until it frames (a
	// dozen bytes at most, once a connection): the relay's watcher of the
	// node's messages starts with it (README "Idle connections").
	var b [1]byte
	for {
		n, err := up.Read(b[:])
		if n == 1 {
			up.head = append(up.head, b[0])
			if _, _, ferr := ldapwire.Frame(up.head, math.MaxUint32); !errors.Is(ferr, ldapwire.ErrShort) {
				return nil // framed, or garbled: the watcher says which
			}
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() && len(up.head) == 0 {
			return noRetry(fmt.Errorf("%w within %v", errNoAnswer, timeout))
		}
		return nil // closed (or a silence after the answer began): the relay passes what follows on
	}
}
