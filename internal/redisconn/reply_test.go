package redisconn

import (
	"context"
	"syscall"
	"testing"
)

// IsReply: an error reply is the store answering (reachable); a timeout,
// a refused connection or no error is not.
func TestIsReply(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{replyErr("NOPERM this user has no permissions to access one of the keys used as arguments"), true},
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{replyErr("ERR unknown command 'GETEX'"), true},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false}, // malformed, not trouble
		{context.DeadlineExceeded, false},
		{syscall.ECONNREFUSED, false},
		{nil, false},
	} {
		if got := IsReply(c.err); got != c.want {
			t.Errorf("IsReply(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
