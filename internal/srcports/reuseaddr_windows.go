package srcports

import "syscall"

// setReuseAddr sets SO_REUSEADDR (on Windows it also lets another socket
// take over a bound port, so a port in use is skipped only at connect).
func setReuseAddr(fd uintptr) error {
	return syscall.SetsockoptInt(syscall.Handle(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
}
