package srcports

import (
	"fmt"
	"syscall"
)

// setTransparent sets IP_TRANSPARENT (IPV6_TRANSPARENT for tcp6), so the
// socket may bind a non-local source address.
func setTransparent(fd uintptr, network string) error {
	var err error
	if network == "tcp6" {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_IPV6, ipv6Transparent, 1)
	} else {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_TRANSPARENT, 1)
	}
	if err != nil {
		return fmt.Errorf("IP_TRANSPARENT (needs CAP_NET_ADMIN): %w", err)
	}
	return nil
}

// ipv6Transparent is IPV6_TRANSPARENT from linux/in6.h (absent from syscall).
const ipv6Transparent = 75
