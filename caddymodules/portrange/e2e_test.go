package portrange_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/portrange"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// reverse_proxy with the port_range transport, through bin/caddy: every
// connection to the upstream comes from local_ip (a loopback address other
// than the kernel's default) and a port of the range, with keep-alive off so
// each request opens one; the requests arrive together.
func TestTransportSourcePortsEndToEnd(t *testing.T) {
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "upstream", upstream, 0)
	front := e2e.Addr(t)
	lo := 23000 + e2e.FreePort(t)%1000
	const localIP = "127.0.0.7"
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	reverse_proxy %s {
		transport port_range {
			ports %d-%d
			local_ip %s
			http {
				keepalive off
			}
		}
	}
}`, front, upstream, lo, lo+99, localIP))
	c.WaitTCP(t, front)
	statuses := burst(20, func(i int) (int, error) { return get(fmt.Sprintf("http://%s/r/%d", front, i)) })
	for i, st := range statuses {
		if st != 200 {
			t.Fatalf("request %d: status %d", i, st)
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
		host, p, _ := net.SplitHostPort(s.Remote)
		port, _ := strconv.Atoi(p)
		if host != localIP {
			t.Errorf("upstream saw a connection from %s, want source address %s (local_ip)", s.Remote, localIP)
		}
		if port < lo || port > lo+99 {
			t.Errorf("upstream saw a connection from %s, outside %d-%d", s.Remote, lo, lo+99)
		}
		ports[port] = true
	}
	if len(ports) < 2 {
		t.Errorf("20 connections used %d distinct ports", len(ports))
	}
}

// With every port of a two-port range busy toward the upstream (slow
// answers, keep-alive off), further requests that arrive at the same time
// fail with 502 and are counted in port_range_exhausted_total, while the
// ones that got a port succeed; once the range is free, requests pass again.
func TestTransportRangeExhaustedEndToEnd(t *testing.T) {
	upstream := e2e.Addr(t)
	p := e2e.Start(t, "slow-upstream", e2e.Bin(t, "testpeer"), nil, "-listen", upstream, "-name", "slow", "-delay", "1500ms")
	p.WaitTCP(t, upstream)
	front := e2e.Addr(t)
	lo := 25000 + e2e.FreePort(t)%1000
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	reverse_proxy %s {
		transport port_range {
			ports %d-%d
			http {
				keepalive off
			}
		}
	}
}`, front, upstream, lo, lo+1))
	c.WaitTCP(t, front)
	// While the burst holds the range, the admin view shows both ports in use.
	done := make(chan []int)
	go func() { done <- burst(6, func(int) (int, error) { return get("http://" + front + "/slow") }) }()
	var views []portrange.TransportView
	full := false
	var statuses []int
	for statuses == nil {
		select {
		case statuses = <-done:
		case <-time.After(20 * time.Millisecond):
			c.AdminJSON(t, "/port_range/", &views)
			if len(views) == 1 && views[0].PortsInUse == 2 {
				full = true
			}
		}
	}
	want := portrange.TransportView{Ports: fmt.Sprintf("%d-%d", lo, lo+1), Size: 2}
	if len(views) != 1 || views[0].Ports != want.Ports || views[0].Size != 2 || !full {
		t.Errorf("admin view during the burst: %+v (both ports seen in use: %v), want %+v", views, full, want)
	}
	ok, refused := 0, 0
	for i, st := range statuses {
		switch st {
		case 200:
			ok++
		case 502:
			refused++
		default:
			t.Errorf("request %d: status %d, want 200 or 502", i, st)
		}
	}
	if ok == 0 || ok > 2 || refused == 0 {
		t.Fatalf("6 concurrent requests over a 2-port range: %d succeeded, %d refused; want 1-2 and the rest refused", ok, refused)
	}
	series := fmt.Sprintf(`caddy_edgesteer_port_range_exhausted_total{ports="%d-%d"}`, lo, lo+1)
	if n, found := c.Metric(t, series); !found || int(n) < refused {
		t.Errorf("%s = %v (found %v), want >= %d", series, n, found, refused)
	}
	c.AdminJSON(t, "/port_range/", &views)
	if len(views) != 1 || int(views[0].ExhaustedTotal) < refused {
		t.Errorf("admin view after the burst: %+v, want exhausted_total >= %d", views, refused)
	}
	if st, err := get("http://" + front + "/again"); err != nil || st != 200 {
		t.Fatalf("after the burst: status %d, %v", st, err)
	}
}

// burst runs n calls of f at once (released together) and returns their
// statuses; an error fails the test.
func burst(n int, f func(i int) (int, error)) []int {
	statuses := make([]int, n)
	e2e.Together(n, func(i int) {
		st, err := f(i)
		if err != nil {
			st = -1
		}
		statuses[i] = st
	})
	return statuses
}

func get(url string) (int, error) {
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
