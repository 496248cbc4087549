package ntier_test

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/ntier"
	"github.com/edgesteer/edgesteer/internal/portrange"
)

// bin/caddy on a lower node, its HTTP server bound with `bind tproxy/…`,
// behind the node's tproxy rules (ntier.TproxyRules, installed here with
// ntier.NetlinkKernel): a client that fetches http://<any address>/ through
// the node reaches Caddy, which sees the client's own address as remote and
// the address the client asked for as local ({http.request.local.*}).
func TestTproxyNetworkEndToEnd(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"client": 10, "l2a": 2})
	tp.Run(t, "client", "ip", "route", "add", "203.0.113.0/24", "via", tp.IP("l2a"))
	tp.Run(t, "client", "ip", "route", "add", "198.51.100.0/24", "via", tp.IP("l2a"))
	rs, err := ntier.TproxyRules(ntier.TproxyConfig{Ports: []portrange.Range{{Lo: 80, Hi: 80}}, ListenPort: 3129})
	if err != nil {
		t.Fatal(err)
	}
	kernel := ntier.NetlinkKernel{NetNS: "/var/run/netns/" + tp.NS("l2a")}
	if err := kernel.Apply(rs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kernel.Remove(rs) })
	tp.StartCaddy(t, "l2a", `{
	auto_https off
}
http://:3129 {
	bind tproxy/0.0.0.0
	respond "{http.request.local.host}:{http.request.local.port} {http.request.remote.host}"
}
`, t.TempDir(), nil)
	client := tp.HTTPClient("client")
	for _, origin := range []string{"203.0.113.80", "198.51.100.9"} {
		resp, err := client.Get("http://" + origin + "/")
		if err != nil {
			t.Fatalf("GET http://%s/: %v", origin, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%s:80 %s", origin, tp.IP("client")); strings.TrimSpace(string(body)) != want {
			t.Errorf("GET http://%s/: %d %q, want %q (local: the address asked for; remote: the client's)", origin, resp.StatusCode, body, want)
		}
	}
}
