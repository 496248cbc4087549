package diameteragent

import (
	"context"
	"net"
	"time"
)

// Clock is the agent's time: its watchdogs, request timeouts, reconnect
// backoff and binding TTLs all run on it, so tests drive them.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or the caller of a test
	// clock's Advance) once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface{ Stop() bool }

// Dialer opens the agent's connection to an upstream peer.
type Dialer func(ctx context.Context, network, address string) (net.Conn, error)

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var defaultDialer Dialer = (&net.Dialer{}).DialContext
