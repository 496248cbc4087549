package latency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// UDPPrefix marks a target address as a UDP publisher, "udp/host:port":
// a TCP connect or handshake says nothing of it, so Split hands it to a
// datagram prober.
const UDPPrefix = "udp/"

// Bounds of a UDP probe exchange: a request fits one datagram on any path,
// and only an answer's first bytes are compared, so a larger answer is
// read truncated into a fixed buffer.
const (
	MaxUDPRequest = 1024
	MaxUDPAnswer  = 512
	udpReadBuffer = 2048
	// maxUDPDatagrams bounds how many datagrams one probe reads while it
	// waits for the expected answer (strays, wrong answers), besides time.
	maxUDPDatagrams = 16
	// defaultUDPWait bounds a probe whose context has no deadline.
	defaultUDPWait = 2 * time.Second
)

// Split probes "udp/host:port" targets with Datagram (given host:port) and
// every other target with Stream.
type Split struct {
	Stream   Prober
	Datagram Prober // nil: a UDP target fails every probe
}

func (s Split) Probe(ctx context.Context, addr string) (time.Duration, error) {
	if rest, ok := strings.CutPrefix(addr, UDPPrefix); ok {
		if s.Datagram == nil {
			return 0, errors.New("no probe configured for UDP publishers")
		}
		return s.Datagram.Probe(ctx, rest)
	}
	return s.Stream.Probe(ctx, addr)
}

// PortProber measures a target's host through another port of it: a UDP
// service is timed by a TCP connect to a TCP service of the same host
// (Prober, default TCPProber). The path is the host's; the UDP service's
// own state is not seen.
type PortProber struct {
	Port   int
	Prober Prober
}

func (p PortProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	pr := p.Prober
	if pr == nil {
		pr = TCPProber{}
	}
	return pr.Probe(ctx, net.JoinHostPort(host, strconv.Itoa(p.Port)))
}

// UDPProber sends Request in one datagram from a fresh socket connected
// to the target (so only the target's datagrams reach it) and times until
// a datagram whose first bytes are Answer arrives (any datagram if Answer
// is empty). Other datagrams are skipped, up to a bound; an ICMP port
// unreachable fails the probe at once (the read returns "connection
// refused"); silence fails it at the context's deadline.
type UDPProber struct {
	Request []byte
	Answer  []byte
}

func (p UDPProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultUDPWait)
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, udpReadBuffer)
	start := time.Now()
	if _, err := c.Write(p.Request); err != nil {
		return 0, err
	}
	for range maxUDPDatagrams {
		n, err := c.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, fmt.Errorf("no answer within %v", time.Since(start).Round(time.Millisecond))
			}
			return 0, err
		}
		if bytes.HasPrefix(buf[:n], p.Answer) {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("no expected answer among %d datagrams", maxUDPDatagrams)
}
