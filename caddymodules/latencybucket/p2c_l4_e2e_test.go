package latencybucket_test

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// nameServer starts a TCP upstream that writes its name and a newline to
// every connection and closes it once the client has closed its side.
func nameServer(t *testing.T, name string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e2e.Accept(t, l, func(c net.Conn, _ func(net.Conn)) {
		go func() {
			c.Write([]byte(name + "\n"))
			io.Copy(io.Discard, c)
			c.Close()
		}()
	})
	return l.Addr().String()
}

// Layer 4 through bin/caddy: two publishers equally near. Connections are
// opened one after another; those that land on the publisher the first one
// went to (the held one) stay open, so each stays in flight there, and
// every other one is ended (the client half-closes, the upstream closes)
// before the next is opened. within p2c counts the open ones and sends
// nearly every new connection to the other publisher; within random about
// half to the held one. A cost that ignored the connections in flight
// would send all of them to the held one (the publisher of the lower
// latency estimate, which the first pick chose).
func TestP2CLayer4CountsOpenConnections(t *testing.T) {
	e2e.SkipShort(t)
	const conns = 40
	for _, within := range []string{"random", "p2c"} {
		t.Run(within, func(t *testing.T) {
			a, b := nameServer(t, "a"), nameServer(t, "b")
			front := e2e.Addr(t)
			cfg := example(t, "publisher-selection-l4.Caddyfile", "127.0.0.1:8443", front,
				"proxy 127.0.0.1:9001 127.0.0.1:9002 127.0.0.1:9003 127.0.0.1:9004", "proxy "+a+" "+b,
				"sticky_ttl 30m", "sticky off\nwithin "+within, "probe_interval 2s", "probe_interval 300ms")
			c := e2e.StartCaddy(t, "caddyfile", cfg)
			c.WaitTCP(t, front)
			adminView(t, c, "l4-apps", 2)
			held, onHeld := "", 0
			for range conns {
				conn, err := net.DialTimeout("tcp", front, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				r := bufio.NewReader(conn)
				name, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("no name: %v", err)
				}
				if held == "" {
					held = name
				}
				if name == held {
					onHeld++
					continue
				}
				// End it, and wait until the proxy has (its flight done).
				conn.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, r)
				conn.Close()
			}
			t.Logf("within %s: %d of %d connections to the held publisher", within, onHeld, conns)
			switch {
			case within == "random" && onHeld < conns/4:
				t.Errorf("random sent %d of %d to the held publisher, want about half", onHeld, conns)
			case within == "p2c" && onHeld > conns/4:
				// Probe RTTs on a loaded loopback can differ several-fold, and
				// cost is RTT × (in flight + 1), so a few picks of the held
				// publisher follow the rule (6 of 40 seen at load); random
				// sends about half.
				t.Errorf("p2c sent %d of %d to the publisher with its connections piling up, want at most %d", onHeld, conns, conns/4)
			}
		})
	}
}
