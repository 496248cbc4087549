package tenantroute_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/caddymodules/tenantroute"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// GET /tenant_route/placement answers where a tenant's next connection
// would go without making one: its nodes in rendezvous order with their
// open connections, the node least connections picks now, and why. Each
// answer names the node the next real connection then reaches. Bad queries
// get a 400 naming the problem.
func TestPlacementQuery(t *testing.T) {
	e2e.SkipShort(t)
	addrs, names := startNodes(t, 3, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", routerConfig(front, addrs, 2, "3s"))
	c.WaitTCP(t, front)
	query := func(q string) (int, []byte) {
		t.Helper()
		resp, err := http.Get("http://" + c.Admin + "/tenant_route/placement?" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}

	own := placement.Rank("acme", addrs)[:2]
	for i := range 6 {
		status, body := query("handler=ldap&tenant=acme")
		var v tenantroute.PlacementView
		if err := json.Unmarshal(body, &v); status != 200 || err != nil {
			t.Fatalf("placement: %d %s %v", status, body, err)
		}
		got := []string{v.Nodes[0].Node, v.Nodes[1].Node}
		if !slices.Equal(got, own) || v.Partitions != 2 || v.PartitionsSource != "default" || v.Members != 3 ||
			v.OpenConnections != i || v.Reason == "" {
			t.Fatalf("placement of acme with %d open: %s (want nodes %v)", i, body, own)
		}
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if reached := marker(t, conn, "acme"); reached != names[v.NextNode] {
			t.Fatalf("placement said %s, the connection reached %s", names[v.NextNode], reached)
		}
	}

	long := strings.Repeat("x", 257)
	for _, tc := range []struct {
		query, want string
		status      int
	}{
		{"handler=ldap", "tenant is required", 400},
		{"tenant=acme", "handler is required", 400},
		{"handler=ldap&tenant=acme&tenant=globex", "tenant is given 2 times", 400},
		{"handler=ldap&tenant=" + long, "tenant is 257 bytes long: at most 256", 400},
		{"handler=ldap&tenant=acme&k=3", `unknown query parameter \"k\"`, 400},
		{"handler=ldap&tenant=a%0Ab", "control character", 400},
		{"handler=ldap&tenant=%zz", "invalid URL escape", 400},
		{"handler=other&tenant=acme", `no tenant_route handler named \"other\"`, 404},
	} {
		status, body := query(tc.query)
		if status != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("?%s: %d %s, want %d with %q", tc.query, status, body, tc.status, tc.want)
		}
	}
	resp, err := http.PostForm("http://"+c.Admin+"/tenant_route/placement", url.Values{"handler": {"ldap"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %s", resp.Status)
	}
}
