package tenantroute_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/caddymodules/tenantroute"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// bindRoute is a Caddyfile whose one layer4 server on front routes the
// LDAP binds that are not anonymous to one tenant_route with options.
func bindRoute(front, options string) string {
	return fmt.Sprintf(`{
	layer4 {
		%s {
			@bind ldap {
				operation bind
				anonymous false
			}
			route @bind {
				tenant_route {
					%s
				}
			}
		}
	}
}
`, front, options)
}

// ldapRouter is bindRoute with a tenant_route named ldap over nodes.
func ldapRouter(front string, nodes []string, options string) string {
	return bindRoute(front, "name ldap\nnodes "+strings.Join(nodes, " ")+"\n"+options)
}

// routerConfig is ldapRouter with k partitions. dial is a per-generation
// setting the tests vary so that each reload really loads (Caddy skips a
// reload to an identical config).
func routerConfig(front string, nodes []string, k int, dial string) string {
	return ldapRouter(front, nodes, fmt.Sprintf("partitions %d\n\t\t\t\t\tdial_timeout %s", k, dial))
}

// loader returns how a test replaces the config: the `caddy reload` CLI
// with the Caddyfile, or POST /load with its JSON (as a config manager).
func loader(c *e2e.Caddy, how string) func(t *testing.T, caddyfile string) {
	return func(t *testing.T, caddyfile string) {
		t.Helper()
		if how == "caddy reload" {
			c.Reload(t, "caddyfile", caddyfile)
			return
		}
		path := filepath.Join(t.TempDir(), "Caddyfile")
		os.WriteFile(path, []byte(caddyfile), 0o644)
		out, err := e2e.CaddyCommand(t, "adapt", "--adapter", "caddyfile", "--config", path).Output()
		if err != nil {
			t.Fatalf("caddy adapt: %v", err)
		}
		c.Load(t, "json", string(out))
	}
}

// searchOn runs a search on an open, bound connection and returns the node
// that answered.
func searchOn(conn *ldap.Conn) (string, error) {
	res, err := conn.Search(ldap.NewSearchRequest("cn=marker,dc=example", ldap.ScopeBaseObject, ldap.NeverDerefAliases,
		0, 0, false, "(objectClass=*)", []string{"description"}, nil))
	if err != nil {
		return "", err
	}
	if len(res.Entries) != 1 {
		return "", fmt.Errorf("%d entries", len(res.Entries))
	}
	return res.Entries[0].GetAttributeValue("description"), nil
}

// waitView polls the admin view until ok accepts it.
func waitView(t *testing.T, c *e2e.Caddy, what string, ok func(v viewT) bool) viewT {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := adminView(t, c)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin view: %s: %+v", what, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Reloads keep the router's process state, through `caddy reload` and
// through POST /load: connections held across reloads stay counted per
// node (admin view and metrics) and keep working; least connections sends
// the next connections to the less loaded node; a run-time partition
// override survives; a changed k and a removed or added node are applied to
// the adopted counts; new connections during reloads all succeed.
func TestReloadKeepsState(t *testing.T) {
	// On Linux each config generation listens on its own SO_REUSEPORT
	// socket and the old one is closed after the new one starts: connections
	// the kernel had queued on the old socket but Caddy had not accepted yet
	// are reset unless the kernel migrates them to the new socket
	// (tcp_migrate_req, Linux 5.14+). The README tells operators to set it;
	// the test sets it in a namespace of its own.
	if !e2e.InNamespace(t, "net.ipv4.tcp_migrate_req=1") {
		return
	}
	for _, how := range []string{"caddy reload", "POST /load"} {
		t.Run(strings.ReplaceAll(how, "/", ""), func(t *testing.T) { testReloadKeepsState(t, how) })
	}
}

func testReloadKeepsState(t *testing.T, how string) {
	addrs, names := startNodes(t, 3, ldif)
	r := placement.Rank("acme", addrs) // acme's nodes in rendezvous order
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", routerConfig(front, addrs, 1, "3s"))
	c.WaitTCP(t, front)
	load := loader(c, how)
	openOn := func(node string) float64 {
		v, _ := c.Metric(t, `caddy_edgesteer_tenant_route_open_connections{handler="ldap",node="`+node+`"}`)
		return v
	}

	// Generation 1, k = 1: 10 acme connections all on r[0]; a run-time
	// override for globex.
	per, onR0 := hold(t, front, "acme", 10)
	if per[names[r[0]]] != 10 {
		t.Fatalf("k=1: acme on %v, want all on %s", per, names[r[0]])
	}
	resp, err := http.Post("http://"+c.Admin+"/tenant_route/partitions", "application/json",
		strings.NewReader(`{"handler": "ldap", "tenant": "globex", "partitions": 3}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("run-time override: %v %v", err, resp)
	}
	resp.Body.Close()

	// Generation 2, k = 2: the 10 are still counted on r[0], so least
	// connections sends the next 10 to r[1].
	load(t, routerConfig(front, addrs, 2, "4s"))
	v := adminView(t, c)
	if v.OpenConnections[r[0]] != 10 || v.Partitions != 2 || v.RuntimePartitions["globex"] != 3 || v.Tenants["acme"].Connections != 10 {
		t.Fatalf("after the reload: %+v", v)
	}
	if got := openOn(r[0]); got != 10 {
		t.Fatalf("metric open_connections of %s after the reload: %v", r[0], got)
	}
	per, onR1 := hold(t, front, "acme", 10)
	if per[names[r[1]]] != 10 {
		t.Fatalf("after the reload acme went to %v, want all 10 on the less loaded %s", per, names[r[1]])
	}
	held := append(append([]*ldap.Conn{}, onR0...), onR1...)
	defer func() {
		for _, conn := range held {
			conn.Close()
		}
	}()

	// Several reloads while new connections keep arriving (4 at a time);
	// after each reload a search on every held connection.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := tenants[1+w%3] // not acme: its counts are checked below
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := func() error {
					conn, err := ldap.DialURL("ldap://" + front)
					if err != nil {
						return err
					}
					defer conn.Close()
					if err := conn.Bind("uid=alice,o="+tenant+",dc=example", "pw-"+tenant); err != nil {
						return err
					}
					_, err = searchOn(conn)
					return err
				}()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	for i := range 5 {
		load(t, routerConfig(front, addrs, 2, fmt.Sprintf("%ds", 5+i)))
		for j, conn := range held {
			node, err := searchOn(conn)
			want := names[r[0]]
			if j >= 10 {
				want = names[r[1]]
			}
			if err != nil || node != want {
				t.Fatalf("reload %d: held connection %d: %q %v, want %s", i+1, j, node, err, want)
			}
		}
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() == 0 {
		t.Fatalf("new connections during the reloads: %d ok, %d failed (first: %v)", ok.Load(), failed.Load(), firstErr.Load())
	}
	t.Logf("%d new connections during 5 reloads, 0 failed", ok.Load())
	waitView(t, c, "only the held connections counted", func(v viewT) bool {
		return v.OpenConnections[r[0]] == 10 && v.OpenConnections[r[1]] == 10 && v.OpenConnections[r[2]] == 0
	})

	// A reload that removes r[0], which holds 10 connections: they are not
	// cut, they stay counted (and listed) until they close; r[0] takes no
	// new connections, and acme's next ones go to r[2], the less loaded of
	// its remaining nodes.
	load(t, routerConfig(front, []string{r[1], r[2]}, 2, "3s"))
	v = adminView(t, c)
	if len(v.Nodes) != 2 || v.OpenConnections[r[0]] != 10 || v.RuntimePartitions["globex"] != 3 {
		t.Fatalf("after removing %s: %+v", r[0], v)
	}
	for j, conn := range onR0 {
		if node, err := searchOn(conn); err != nil || node != names[r[0]] {
			t.Fatalf("held connection %d on the removed node: %q %v", j, node, err)
		}
	}
	per, onR2 := hold(t, front, "acme", 10)
	held = append(held, onR2...)
	if per[names[r[2]]] != 10 {
		t.Fatalf("with %s removed acme went to %v, want all 10 on %s", r[0], per, names[r[2]])
	}
	for _, conn := range onR0 {
		conn.Close()
	}
	waitView(t, c, "the removed node forgotten once its connections closed", func(v viewT) bool {
		_, listed := v.OpenConnections[r[0]]
		return !listed && v.Tenants["acme"].Connections == 20
	})
	if _, listed := c.Metric(t, `caddy_edgesteer_tenant_route_open_connections{handler="ldap",node="`+r[0]+`"}`); listed {
		t.Fatalf("metric still lists the removed %s", r[0])
	}

	// A reload that adds r[0] back: acme's nodes are r[0] and r[1] again;
	// r[1] holds 10, r[0] none, so the next 5 go to r[0].
	load(t, routerConfig(front, addrs, 2, "4s"))
	per, back := hold(t, front, "acme", 5)
	held = append(held, back...)
	if per[names[r[0]]] != 5 {
		t.Fatalf("with %s back acme went to %v, want all 5 there", r[0], per)
	}
	if v := adminView(t, c); v.RuntimePartitions["globex"] != 3 || len(v.Nodes) != 3 {
		t.Fatalf("at the end: %+v", v)
	}
}

type viewT = tenantroute.View
