package redisconn

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Kind is what an error of one Redis command means to a module: every
// module asks Classify, so one error is read the same way everywhere.
type Kind int

const (
	// OK: no error.
	OK Kind = iota
	// NotFound: the key or field does not exist (redis.Nil).
	NotFound
	// Malformed: the store answered, and the value it holds is not one
	// this module wrote (WRONGTYPE: another program's key of another type,
	// also inside a script's ERR on Redis 6; "not an integer" from an
	// increment over a garbage field). The value
	// is ignored and counted, and rewritten where the module says so.
	Malformed
	// Trouble: the store could not do what was asked for the keys the
	// command touched (refused by ACL, not authenticated, loading,
	// read-only replica, out of memory, a Cluster slot down or moving, a
	// timeout, reset or closed connection). Those keys go to the module's
	// documented fallback, and the module says so.
	Trouble
)

func (k Kind) String() string {
	switch k {
	case OK:
		return "ok"
	case NotFound:
		return "not_found"
	case Malformed:
		return "malformed"
	}
	return "trouble"
}

// Classify says what err, the error of one Redis command (or of a
// value's parse by the caller, wrapped with ErrMalformed), means.
func Classify(err error) Kind {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, redis.Nil):
		return NotFound
	case errors.Is(err, ErrMalformed):
		return Malformed
	}
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.ErrClosed) {
		switch prefix(re.Error()) {
		case "WRONGTYPE":
			return Malformed
		case "ERR":
			// Redis 6 wraps a script's failed call in one ERR ("ERR Error
			// running script (call to f_…): @user_script:1: WRONGTYPE
			// Operation against a key holding the wrong kind of value");
			// Redis 7 passes the WRONGTYPE reply through.
			if m := re.Error(); strings.Contains(m, wrongKind) || strings.Contains(m, "not an integer") ||
				strings.Contains(m, "not a valid float") {
				return Malformed
			}
		}
	}
	return Trouble
}

// wrongKind is the text of Redis' WRONGTYPE reply, which a script's ERR
// carries on Redis 6.
const wrongKind = "Operation against a key holding the wrong kind of value"

// ErrMalformed marks an error of the caller's own parse of a value the
// store returned: wrap it (fmt.Errorf("%w: …", redisconn.ErrMalformed)) and
// Classify reads it as Malformed.
var ErrMalformed = errors.New("malformed value")

// Reasons are the values Reason returns: a bounded set, fit for a metric
// label.
var Reasons = []string{"noperm", "noauth", "loading", "readonly", "oom", "clusterdown", "tryagain", "moved",
	"busy", "timeout", "closed", "refused", "reset", "network", "error_reply", "other"}

// Reason names the kind of store trouble in one word of Reasons ("" for an
// error that is not Trouble), for metric labels and the admin views.
func Reason(err error) string {
	if Classify(err) != Trouble {
		return ""
	}
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.ErrClosed) {
		switch p := prefix(re.Error()); p {
		case "NOPERM", "NOAUTH", "LOADING", "READONLY", "OOM", "CLUSTERDOWN", "TRYAGAIN", "MOVED", "BUSY":
			return strings.ToLower(p)
		case "ASK":
			return "moved"
		case "WRONGPASS":
			return "noauth"
		case "MASTERDOWN":
			return "clusterdown"
		}
		return "error_reply"
	}
	var ne net.Error
	switch {
	case errors.Is(err, redis.ErrClosed) || errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "reset"
	case errors.As(err, &ne):
		return "network"
	}
	return "other"
}

// prefix is the first word of an error reply ("NOPERM", "ERR").
func prefix(s string) string {
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return s
}
