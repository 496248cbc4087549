package srcports

import "syscall"

// TransparentControl is a Control function for net.ListenConfig or
// net.Dialer that sets IP_TRANSPARENT (IPV6_TRANSPARENT on tcp6 sockets):
// a listener then accepts connections a tproxy rule hands it for any
// destination address, and a dialer may bind a non-local source.
func TransparentControl(network, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = setTransparent(fd, network) }); err != nil {
		return err
	}
	return serr
}
