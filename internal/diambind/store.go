// Package diambind is the shared level of a Diameter agent's Session-Id
// bindings: replicas of one agent keep each binding in a store (Redis in
// production, a fake in tests) so that a session opened through one
// replica and continued through another stays on its server. The agent's
// own table stays the first level: the store is read only on a local miss
// of a request that continues a session, and written off the request's
// path by one goroutine from a bounded queue. While the store is down the
// agent goes on with its local bindings; what it decided meanwhile waits
// in the queue and is written (reconciled) when the store answers again.
// It knows nothing of Caddy or of Diameter's wire: the agent hands it
// Session-Ids and server identities.
package diambind

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/edgesteer/edgesteer/internal/storefault"
)

// Store is the key-value store every replica reads and writes.
type Store interface {
	// Get returns key's value and renews its expiry to ttl (Redis GETEX);
	// ErrNotFound if there is none.
	Get(ctx context.Context, key string, ttl time.Duration) (string, error)
	// Apply runs ops in one round trip (a pipeline) and returns a result
	// per op, in order.
	Apply(ctx context.Context, ops []Op, ttl time.Duration) []Result
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// Kind is what an Op does to a binding's key.
type Kind uint8

const (
	// Claim writes the binding unless the key holds one (SET NX) and
	// renews the key's expiry; its Result's Value is what the key holds
	// after it: ours, or the binding another replica wrote first.
	Claim Kind = iota
	// Move overwrites the key (SET): the session moved to another server.
	Move
	// End deletes the key (DEL): the session ended.
	End
)

// Op is one write of the queue.
type Op struct {
	Kind  Kind
	Key   string
	Value string // the server's identity (Claim, Move)
}

// Result is the outcome of one Op.
type Result struct {
	Value string // Claim: the key's value after it
	Err   error
}

// Errors a Store returns for what is not a failure of the store.
var (
	ErrNotFound  = errors.New("diambind: no such key")
	ErrMalformed = errors.New("diambind: key holds a value of another type")
)

// Trouble is what a Store returns for a call the store could not do: the
// adapter classifies its client's error once (internal/storefault).
type Trouble = storefault.Error

// Bounds on keys and values.
const (
	// MaxValueLen is the longest value taken as a server identity (a
	// DiameterIdentity is an FQDN: 255 bytes at most).
	MaxValueLen = 255
	// maxSessionLen is the longest escaped Session-Id put in a key as is;
	// a longer one is replaced by its SHA-256.
	maxSessionLen = 200
)

// Key is the store key of a Session-Id: the prefix, then the Session-Id
// with "%", braces (Redis Cluster hash tags) and every byte outside
// printable ASCII as %XX, or "sha256:" and the hex digest of that when it
// is longer than 200 bytes, so a key's length is bounded whatever the
// client sends.
func Key(prefix string, sid []byte) string {
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(prefix)+1+len(sid)+8)
	b = append(append(b, prefix...), ':')
	start := len(b)
	for _, c := range sid {
		if c <= ' ' || c >= 0x7f || c == '%' || c == '{' || c == '}' {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	if len(b)-start > maxSessionLen {
		sum := sha256.Sum256(b[start:])
		b = append(append(b[:start], "sha256:"...), hex.EncodeToString(sum[:])...)
	}
	return string(b)
}

// wellFormed says whether v can be a server identity: not empty, not too
// long, printable ASCII without spaces. The agent also checks it names a
// server of its peer table.
func wellFormed(v string) bool { return storefault.Word(v, MaxValueLen) }
