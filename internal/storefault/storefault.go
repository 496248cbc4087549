// Package storefault is the one shape of a shared store's failure as the
// engines see it (pubsel's sticky store, diambind's bindings): the adapter
// classifies its client's error once (internal/redisconn for Redis) into
// an Error, and the engine reads the reason word and whether the store
// answered. Only failures without an answer are evidence of a down store.
package storefault

import (
	"context"
	"errors"
)

// Error is what a store returns for a call it could not do (not a missing
// key, not a value of the wrong type).
type Error struct {
	// Reason is one bounded word naming the trouble ("noperm", "timeout",
	// "refused"…), for metrics and the admin views.
	Reason string
	// Answered says the store answered with an error reply (refused by an
	// ACL, read-only, out of memory, loading…): it is reachable and
	// refused this key; such answers never mark it unreachable.
	Answered bool
	Err      error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Read reads a failed call's error: its reason word (at most 32 bytes,
// else "other") and whether the store answered; a context deadline is
// "timeout", without an answer.
func Read(err error) (reason string, answered bool) {
	var se *Error
	switch {
	case errors.As(err, &se):
		r := se.Reason
		if r == "" || len(r) > 32 {
			r = "other"
		}
		return r, se.Answered
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout", false
	}
	return "other", false
}

// Word says whether v, a value read from a store, can be a name the
// engines keep there (a publisher address, a server identity): not empty,
// at most maxLen bytes, printable ASCII without spaces. Values from the
// store are network input.
func Word(v string, maxLen int) bool {
	if v == "" || len(v) > maxLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] >= 0x7f {
			return false
		}
	}
	return true
}
