//go:build unix

package relay

import (
	"io"
	"os"
	"syscall"
)

const canReadDirect = true

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

// readDirect reads from fd into a borrowed buffer (after w.held), without
// blocking: with nothing to read it gives the buffer back and returns
// false, so RawConn.Read waits in the poller holding no buffer.
func (w *waiter) readDirect(fd uintptr) bool {
	if w.bp == nil {
		w.bp, w.k = borrow(w.held)
	}
	n, err := syscall.Read(int(fd), (*w.bp)[w.k:])
	switch {
	case err == syscall.EAGAIN:
		if len(*w.bp) == BufferSize { // a long held message keeps its own
			giveBack(w.bp)
			w.bp = nil
		}
		return false
	case err == syscall.EINTR:
		return w.readDirect(fd)
	case err != nil:
		w.err = os.NewSyscallError("read", err)
	case n == 0:
		w.err = io.EOF
	default:
		w.n = n
	}
	return true
}
