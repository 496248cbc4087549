// Package ntier holds the Caddy side of transparent N-tier cache
// redirection. So far: the `tproxy` network, a Caddy listener network
// whose TCP sockets set IP_TRANSPARENT, so any Caddy server or layer4 app
// can `bind tproxy/ADDR` and accept connections that the lower node's
// tproxy rule (internal/ntier.TproxyRules) hands it for any destination.
// The control plane that installs the rules is internal/ntier.
package ntier

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

// Network is the listener network's name: `bind tproxy/0.0.0.0`.
const Network = "tproxy"

func init() { caddy.RegisterNetwork(Network, listenTransparent) }

// listenTransparent listens on TCP as Caddy itself would (SO_REUSEPORT,
// shared across a reload), with IP_TRANSPARENT set on the socket before
// bind. The connection's remote address is the client's own and its local
// address the destination the client asked for, so nothing (no PROXY
// header) has to carry them.
func listenTransparent(ctx context.Context, _, host, portRange string, portOffset uint, cfg net.ListenConfig) (any, error) {
	na, err := caddy.ParseNetworkAddress(net.JoinHostPort(host, portRange))
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", Network, net.JoinHostPort(host, portRange), err)
	}
	prev := cfg.Control
	cfg.Control = func(network, address string, c syscall.RawConn) error {
		if prev != nil {
			if err := prev(network, address, c); err != nil {
				return err
			}
		}
		return srcports.TransparentControl(network, address, c)
	}
	ln, err := na.Listen(ctx, portOffset, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", Network, na.JoinHostPort(portOffset), err)
	}
	return ln, nil
}
