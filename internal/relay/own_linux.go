package relay

import (
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Own returns a second connection on c's socket, which stays open when c
// is closed: a handler whose caller closes c on return (caddy-l4 does)
// can return and leave the socket relayed by Start. It duplicates the
// descriptor and registers it with Go's poller, three syscalls; c.File
// and net.FileConn take twenty (two dups, the blocking mode cleared and
// set again, the addresses read back, five socket options applied).
func Own(c *net.TCPConn) (net.Conn, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, os.NewSyscallError("fcntl", derr)
	}
	local, remote := c.LocalAddr(), c.RemoteAddr()
	// Still non-blocking (the flag belongs to the socket, not the
	// descriptor): os.NewFile makes it pollable, with deadlines. A file
	// Go's poller could not take has none, and Start would then block a
	// thread per read: the caller relays in place instead.
	f := os.NewFile(uintptr(fd), "tcp "+local.String()+"->"+remote.String())
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, err
	}
	return &owned{File: f, local: local, remote: remote}, nil
}

// owned is a connection on a duplicate descriptor: a pollable os.File
// (its errors read "read tcp a->b: …") with a TCP connection's addresses
// and half-close.
type owned struct {
	*os.File
	local, remote net.Addr
}

func (c *owned) LocalAddr() net.Addr  { return c.local }
func (c *owned) RemoteAddr() net.Addr { return c.remote }

// CloseWrite shuts down the sending side, as TCPConn.CloseWrite does.
func (c *owned) CloseWrite() error {
	raw, err := c.File.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "shutdown", Path: c.File.Name(), Err: serr}
	}
	return nil
}
