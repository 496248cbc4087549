package portrange_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// reverse_proxy with the port_range transport, through bin/caddy: every
// connection to the upstream comes from a port of the range, with
// keep-alive off so each request opens one.
func TestTransportSourcePortsEndToEnd(t *testing.T) {
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "upstream", upstream, 0)
	front := e2e.Addr(t)
	lo := 23000 + e2e.FreePort(t)%1000
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	reverse_proxy %s {
		transport port_range {
			ports %d-%d
			local_ip 127.0.0.1
			http {
				keepalive off
			}
		}
	}
}`, front, upstream, lo, lo+99))
	c.WaitTCP(t, front)
	for i := range 20 {
		resp, err := http.Get(fmt.Sprintf("http://%s/r/%d", front, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	resp, err := http.Get("http://" + upstream + "/_seen")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen []struct{ Remote string }
	if err := json.NewDecoder(resp.Body).Decode(&seen); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 20 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	ports := map[int]bool{}
	for _, s := range seen {
		_, p, _ := net.SplitHostPort(s.Remote)
		port, _ := strconv.Atoi(p)
		if port < lo || port > lo+99 {
			t.Errorf("upstream saw a connection from %s, outside %d-%d", s.Remote, lo, lo+99)
		}
		ports[port] = true
	}
	if len(ports) < 2 {
		t.Errorf("20 connections used %d distinct ports", len(ports))
	}
}
