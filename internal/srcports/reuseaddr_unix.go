//go:build unix

package srcports

import "syscall"

// setReuseAddr sets SO_REUSEADDR: a port in TIME_WAIT, or in use toward
// another destination, may be bound again.
func setReuseAddr(fd uintptr) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
}
