package peerratelimit_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// layer4 connections per peer: a peer that has used up its burst of
// connections gets none back from a reload (`caddy reload`, POST /load).
func TestReloadLayer4KeepsExhaustedBuckets(t *testing.T) {
	front, upstream := e2e.Addr(t), e2e.Addr(t)
	e2e.StartPeer(t, "peer", upstream, 0)
	config := func(gen int) string {
		return fmt.Sprintf(`{
	layer4 {
		%s {
			route {
				peer_rate_limit {
					name reload-l4
					profile all {
						rate 0.01 3
						action reject 0 "refused by generation %d"
					}
				}
				proxy %s
			}
		}
	}
}`, front, gen, upstream)
	}
	c := e2e.StartCaddy(t, "caddyfile", config(1))
	c.WaitTCP(t, front)
	connect := func(src string) string {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		conn, err := d.Dial("tcp", front)
		if err != nil {
			return "dial error: " + err.Error()
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
		body, _ := io.ReadAll(conn)
		if strings.Contains(string(body), "peer GET /") {
			return "admitted"
		}
		return strings.TrimSpace(string(body))
	}
	for i := range 3 {
		if got := connect("127.0.0.2"); got != "admitted" {
			t.Fatalf("connection %d: %s", i, got)
		}
	}
	if got := connect("127.0.0.2"); got != "refused by generation 1" {
		t.Fatalf("past the burst: %q", got)
	}
	for gen := 2; gen <= 3; gen++ {
		if gen == 2 {
			c.Reload(t, "caddyfile", config(gen))
		} else {
			c.Load(t, "caddyfile", config(gen))
		}
		if got := connect("127.0.0.2"); got != fmt.Sprint("refused by generation ", gen) {
			t.Fatalf("after reload %d the exhausted peer got %q", gen-1, got)
		}
		if got := connect(fmt.Sprint("127.0.0.", 10+gen)); got != "admitted" {
			t.Fatalf("after reload %d a new peer got %q", gen-1, got)
		}
	}
}

// Diameter mode: a pGW's CCR-I limit stays used up across reloads, on
// the connection it had before them (which follows the new config from
// its next request: the new error message) and on a new one.
func TestReloadDiameterKeepsBucketsAndMovesConnections(t *testing.T) {
	pcrf, _ := diamServer(t)
	front := e2e.Addr(t)
	config := func(gen int, rate string) string {
		return fmt.Sprintf(`{
	layer4 {
		%s {
			@diameter diameter
			route @diameter {
				peer_rate_limit {
					name reload-diameter
					diameter {
						origin_host dra.example
						origin_realm example
						error_message "refused by generation %d"
					}
					profile pgw {
						message gx-ccr-i {
							rate %s
						}
					}
				}
				proxy %s
			}
		}
	}
}`, front, gen, rate, pcrf)
	}
	c := e2e.StartCaddy(t, "caddyfile", config(1, "0.01 2"))
	c.WaitTCP(t, front)
	old := dialDiameter(t, front)
	hbh := uint32(100)
	answers := 1 // the CEA
	ccri := func(cl *diamClient) answer {
		t.Helper()
		hbh++
		cl.send(t, request(diameter.CmdCreditControl, diameter.AppGx, 1, hbh, fmt.Sprint("s;", hbh)))
		return cl.get(hbh)
	}
	send := func(cl *diamClient, n *int) answer {
		t.Helper()
		ccri(cl)
		*n++
		cl.wait(t, *n, 10*time.Second)
		return cl.get(hbh)
	}
	for i := range 2 {
		if a := send(old, &answers); a.result != diam.Success {
			t.Fatalf("CCR-I %d: %+v", i, a)
		}
	}
	if a := send(old, &answers); a.result != 3002 || a.errMsg != "refused by generation 1" {
		t.Fatalf("past the burst: %+v", a)
	}
	for gen := 2; gen <= 3; gen++ {
		if gen == 2 {
			c.Reload(t, "caddyfile", config(gen, "0.01 2"))
		} else {
			c.Load(t, "caddyfile", config(gen, "0.01 2"))
		}
		want := fmt.Sprint("refused by generation ", gen)
		if a := send(old, &answers); a.result != 3002 || a.errMsg != want {
			t.Fatalf("after reload %d, on the old connection: %+v", gen-1, a)
		}
		fresh := dialDiameter(t, front)
		n := 1
		if a := send(fresh, &n); a.result != 3002 || a.errMsg != want {
			t.Fatalf("after reload %d, on a new connection: %+v", gen-1, a)
		}
	}
	// A raised limit applies to the old connection at once.
	c.Load(t, "caddyfile", config(4, "100000"))
	if a := send(old, &answers); a.result != diam.Success {
		t.Fatalf("after raising the limit, the old connection: %+v", a)
	}
}

// caddy-l4's matching_timeout, as the READMEs describe it: a peer that
// sends an incomplete first message is closed unanswered once the
// timeout passes, with caddy-l4's warning; a whole CER in time is served.
func TestDiameterMatchingTimeout(t *testing.T) {
	pcrf, _ := diamServer(t)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			matching_timeout 1s
			@pgw diameter {
				origin_host pgw*.example
			}
			route @pgw {
				proxy %s
			}
		}
	}
}`, front, pcrf))
	c.WaitTCP(t, front)
	conn, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cer := request(diameter.CmdCapabilitiesExchange, 0, 0, 1, "")
	conn.Write(cer[:30]) // the header and part of the body
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := conn.Read(make([]byte, 64))
	if n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("incomplete first message: read %d bytes, err %v; want the connection closed unanswered", n, err)
	}
	c.WaitLog(t, "aborted matching according to timeout", 5*time.Second)
	dialDiameter(t, front) // a whole CER is answered
}
