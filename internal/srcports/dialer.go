package srcports

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrExhausted means every port tried in the range was in use toward the
// destination.
var ErrExhausted = errors.New("source port range exhausted")

// maxTries bounds the ports tried for one dial, so a nearly full range
// costs a bounded number of syscalls rather than a scan of 64k ports.
const maxTries = 4096

// Dialer opens TCP connections whose source port lies in Ports. Ports are
// taken round robin from a random start; one in use (EADDRINUSE at bind,
// or EADDRNOTAVAIL at connect when the same 4-tuple exists) is skipped.
// SO_REUSEADDR lets a port in TIME_WAIT, or in use toward another
// destination, be bound again: only the full 4-tuple must be unique.
type Dialer struct {
	Ports Range
	// LocalIP, if valid, is the source address; otherwise the kernel picks.
	LocalIP netip.Addr
	// Transparent sets IP_TRANSPARENT so a non-local source address (the
	// client's, NetScaler's USIP) can be bound. Needs CAP_NET_ADMIN and
	// policy routing that brings the replies back to this host.
	Transparent bool
	Timeout     time.Duration

	next atomic.Uint32
	// Skipped counts ports found in use; Exhausted counts dials that gave up.
	Skipped, Exhausted atomic.Uint64
}

// NewDialer returns a dialer over r starting at a random port.
func NewDialer(r Range) *Dialer {
	d := &Dialer{Ports: r}
	d.next.Store(rand.Uint32())
	return d
}

// DialContext dials from LocalIP (if set) and a port of the range.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.DialFrom(ctx, network, addr, d.LocalIP)
}

// DialFrom dials from src (any address if invalid) and a port of the range.
func (d *Dialer) DialFrom(ctx context.Context, network, addr string, src netip.Addr) (net.Conn, error) {
	size := d.Ports.Size()
	tries := min(size, maxTries)
	for range tries {
		port := d.Ports.Lo + uint16((d.next.Add(1)-1)%uint32(size))
		nd := net.Dialer{
			Timeout:   d.Timeout,
			LocalAddr: &net.TCPAddr{IP: src.AsSlice(), Port: int(port), Zone: src.Zone()},
			Control:   d.control,
		}
		c, err := nd.DialContext(ctx, network, addr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return nil, err
		}
		d.Skipped.Add(1)
	}
	d.Exhausted.Add(1)
	return nil, fmt.Errorf("dial %s from ports %s: %w (%d tried)", addr, d.Ports, ErrExhausted, tries)
}

func (d *Dialer) control(network, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = setReuseAddr(fd)
		if serr == nil && d.Transparent {
			serr = setTransparent(fd, network)
		}
	})
	if err != nil {
		return err
	}
	return serr
}
