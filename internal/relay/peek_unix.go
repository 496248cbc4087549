//go:build unix

package relay

import (
	"os"
	"syscall"
)

// readable reports whether a read from fd would not block: it peeks at one
// byte. Go's sockets are non-blocking, so with nothing to read the peek
// fails with EAGAIN and returning false makes RawConn.Read wait in the
// poller. EOF counts as readable: the read that follows reports it. An
// error (a reset) is kept for wait to return: the socket forgets it once
// told.
func (w *waiter) readable(fd uintptr) bool {
	_, _, err := syscall.Recvfrom(int(fd), w.peek[:], syscall.MSG_PEEK)
	switch err {
	case nil:
		return true
	case syscall.EAGAIN:
		return false
	case syscall.EINTR:
		return w.readable(fd)
	}
	w.err = os.NewSyscallError("recvfrom", err)
	return true
}
