package cacheredirect_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Bad bytes from the upper tier: a connection whose PROXY v2 header is
// malformed is closed without an answer, and only that one; a well-formed
// header's client address reaches the origin as Client-IP.
func TestMalformedProxyHeaderClosesOneConnection(t *testing.T) {
	origin := e2e.Addr(t)
	e2e.StartPeer(t, "origin", origin, 0)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	servers {
		listener_wrappers {
			proxy_protocol {
				allow 127.0.0.1/32
			}
		}
	}
}
http://%s {
	cache_redirect {
		caches 127.0.0.31:1
		origin %s
	}
}`, front, origin))
	c.WaitTCP(t, front)
	send := func(header []byte) string {
		t.Helper()
		conn, err := net.Dial("tcp", front)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write(header)
		fmt.Fprintf(conn, "POST /api/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(conn)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the server neither answered nor closed the connection")
		}
		return string(b)
	}
	// The v2 signature, then version 3 (only 2 exists) and a nonsense length.
	bad := append([]byte("\r\n\r\n\x00\r\nQUIT\n"), 0x31, 0x11, 0xff, 0xff)
	if got := send(bad); got != "" {
		t.Fatalf("a malformed PROXY header got an answer: %q", got)
	}
	good := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 40000},
		&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 80})
	hb, err := good.Format()
	if err != nil {
		t.Fatal(err)
	}
	if got := send(hb); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("after the malformed one, a good connection got %q", got)
	}
	resp, err := http.Get("http://" + origin + "/_seen")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"client_ip":"192.0.2.7"`) || strings.Count(string(body), `"path"`) != 1 {
		t.Fatalf("origin saw %s", body)
	}
}
