package latencybucket_test

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// udp_probe tcp <port> with real packet delay: bin/caddy in its own network
// namespace proxies UDP to four DNS publishers, each on a host of its own
// and measured by a TCP connect to port 8053 of that host. Packets from the
// proxy to far are held 40 ms (NFQUEUE); notcp answers DNS but has nothing on
// TCP 8053, so its probes are refused: inactive, never chosen (the tcp kind
// sees the host's TCP port, not the UDP service). far is measured in
// [32,64); 12 client IPs, 3 flows each, all go to near-1 or near-2, both
// used, and each IP keeps its publisher.
func TestUDPProbeTCPPortRealDelay(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"proxy": 1, "near1": 11, "near2": 12, "far": 13, "notcp": 14})
	var pubs []string
	for _, h := range []struct {
		host, name string
		tcp        bool
	}{{"near1", "near-1", true}, {"near2", "near-2", true}, {"far", "far", true}, {"notcp", "notcp", false}} {
		ip := tp.IP(h.host)
		err := tp.In(h.host, func() error {
			dnsPublisher(t, ip+":5300", h.name, 0, false)
			if !h.tcp {
				return nil
			}
			l, err := net.Listen("tcp", ip+":8053")
			if err != nil {
				return err
			}
			e2e.Accept(t, l, func(c net.Conn, _ func(net.Conn)) { c.Close() })
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, "udp/"+ip+":5300")
	}
	tp.Delay(t, "proxy", map[string]time.Duration{tp.IP("far"): 40 * ms})
	cfg := fmt.Sprintf(`{
	layer4 {
		udp/127.0.0.1:5353 {
			route {
				proxy %s %s %s %s {
					lb_policy latency_bucket {
						name udp-tcpport
						udp_probe tcp 8053
						probe_interval 300ms
						probe_timeout 500ms
					}
				}
			}
		}
	}
}
`, pubs[0], pubs[1], pubs[2], pubs[3])
	c := tp.StartCaddy(t, "proxy", cfg, t.TempDir(), nil)
	admin := tp.HTTPClient("proxy")
	var v []latencybucket.PolicyView
	c.WaitFor(t, "3 measured, notcp inactive", 30*time.Second, func() error {
		resp, err := admin.Get("http://127.0.0.1:2019/latency_bucket/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		v = nil
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || len(v) != 1 {
			return fmt.Errorf("view %v %v", v, err)
		}
		want := map[string]string{pubs[0]: "[0,32)", pubs[1]: "[0,32)", pubs[2]: "[32,64)", pubs[3]: "unmeasured"}
		for _, p := range v[0].Publishers {
			if p.Bucket != want[p.Address] || p.Active != (p.Address != pubs[3]) || p.Rounds < 2 {
				return fmt.Errorf("%s: %s active=%v after %d rounds (%s)", p.Address, p.Bucket, p.Active, p.Rounds, p.LastError)
			}
		}
		return nil
	})
	for _, p := range v[0].Publishers {
		t.Logf("%s: %s %.1f ms active=%v %s", p.Address, p.Bucket, p.LatencyMS, p.Active, p.LastError)
	}

	pinned := map[string]string{}
	served := map[string]int{}
	for u := range 12 {
		src := fmt.Sprintf("127.0.0.%d", 10+u)
		dial := tp.Dialer("proxy", &net.UDPAddr{IP: net.ParseIP(src)})
		for f := range 3 {
			name, err := udpFlowVia(dial, "127.0.0.1:5353", 5*time.Second)
			if err != nil {
				t.Fatalf("user %s flow %d: %v", src, f, err)
			}
			served[name]++
			if first, ok := pinned[src]; !ok {
				pinned[src] = name
			} else if name != first {
				t.Fatalf("user %s: flow %d went to %s, its first to %s", src, f, name, first)
			}
		}
	}
	t.Logf("flows per publisher: %v", served)
	if served["far"]+served["notcp"] != 0 || served["near-1"] == 0 || served["near-2"] == 0 {
		t.Fatalf("flows per publisher %v: want only near-1 and near-2, both", served)
	}
}
