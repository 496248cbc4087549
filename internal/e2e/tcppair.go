package e2e

import (
	"net"
	"testing"
)

// TCPPair returns the two ends of a loopback TCP connection, the dialed
// one first; both are closed when the test ends. Tests of relays put one
// pair on each side: (client peer, client) and (upstream, node peer).
func TCPPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); a.Close() })
	return d.(*net.TCPConn), a.(*net.TCPConn)
}
