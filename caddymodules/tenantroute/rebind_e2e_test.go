package tenantroute_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/caddymodules/tenantroute"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// sampler polls the admin view while a test runs and keeps, per node, the
// highest count it saw.
type sampler struct {
	stop    chan struct{}
	done    sync.WaitGroup
	mu      sync.Mutex
	highest map[string]int64
	samples int
}

func sample(t *testing.T, c *e2e.Caddy) *sampler {
	t.Helper()
	s := &sampler{stop: make(chan struct{}), highest: map[string]int64{}}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		client := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			resp, err := client.Get("http://" + c.Admin + "/tenant_route/")
			if err != nil {
				continue
			}
			var v []tenantroute.View
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if err != nil || len(v) != 1 {
				continue
			}
			s.mu.Lock()
			s.samples++
			for n, k := range v[0].OpenConnections {
				s.highest[n] = max(s.highest[n], k)
			}
			s.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(s.end)
	return s
}

func (s *sampler) end() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.done.Wait()
}

// check ends the sampling and fails if any sample had a node past ceiling.
func (s *sampler) check(t *testing.T, ceiling int64) {
	t.Helper()
	s.end()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.samples < 10 {
		t.Fatalf("only %d samples of the admin view", s.samples)
	}
	for n, k := range s.highest {
		if k > ceiling {
			t.Fatalf("a sample of the admin view had %s at %d connections, past max_per_node %d (highest per node %v, %d samples)",
				n, k, ceiling, s.highest, s.samples)
		}
	}
	t.Logf("%d samples of the admin view, highest per node %v (max_per_node %d)", s.samples, s.highest, ceiling)
}

// resultCode is the LDAP result of err (0: none), or -1 for an error that is
// not an LDAP result (the connection closed).
func resultCode(err error) int {
	if err == nil {
		return 0
	}
	var le *ldap.Error
	if errors.As(err, &le) && le.ResultCode != ldap.ErrorNetwork {
		return int(le.ResultCode)
	}
	return -1
}

// whoAmI is the identity the node holds for conn ("" anonymous).
func whoAmI(t *testing.T, conn *ldap.Conn) string {
	t.Helper()
	res, err := conn.WhoAmI(nil)
	if err != nil {
		t.Fatalf("whoami: %v", err)
	}
	return res.AuthzID
}

// A connection whose first bind failed while its tenant had room, and that
// then binds correctly once the tenant's nodes are full (k at auto's max),
// is refused with LDAP busy (51), counted and logged as a new connection
// would be; it stays open and anonymous on its node (the bind never
// reached it) and binds later once its node has room. No sample of the
// admin view, polled throughout, has a node past max_per_node. After a
// reload that raises auto's max, such a rebind grows the tenant (all its
// nodes full) before it is refused, and a new connection reaches the new
// node.
func TestRebindAfterFailedBindMeetsTheCeiling(t *testing.T) {
	e2e.SkipShort(t)
	addrs, names := startNodes(t, 3, ldif)
	front := e2e.Addr(t)
	config := func(max int) string {
		return strings.Replace(autoConfig(front, addrs, fmt.Sprintf(`auto_partitions {
						target_per_node 100
						max %d
					}
					max_per_node 4
					max_failed_binds 10`, max)), "{\n\tlayer4", "{\n\tdebug\n\tlayer4", 1)
	}
	c := e2e.StartCaddy(t, "caddyfile", config(2))
	c.WaitTCP(t, front)
	own := placement.Rank("acme", addrs)
	s := sample(t, c)

	failed := make([]*ldap.Conn, 4)
	for i := range failed {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if code := resultCode(conn.Bind("uid=alice,o=acme,dc=example", "wrong")); code != ldap.LDAPResultInvalidCredentials {
			t.Fatalf("wrong password: result %d", code)
		}
		failed[i] = conn
	}
	failedOn := make([]string, len(failed)) // by the anonymous search's answer
	for i, conn := range failed {
		var err error
		if failedOn[i], err = searchOn(conn); err != nil {
			t.Fatal(err)
		}
	}
	if v := adminView(t, c); v.UnauthenticatedConnections != 4 || v.OpenConnections[own[0]] != 0 || v.OpenConnections[own[1]] != 0 {
		t.Fatalf("after 4 failed binds: %+v", v)
	}
	held := wave(t, front, "acme", 8)
	if v := adminView(t, c); v.OpenConnections[own[0]] != 4 || v.OpenConnections[own[1]] != 4 {
		t.Fatalf("acme's nodes not full: %v", v.OpenConnections)
	}

	// The failed connections bind correctly, all at once.
	var wg sync.WaitGroup
	for _, conn := range failed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code := resultCode(conn.Bind("uid=alice,o=acme,dc=example", "pw-acme")); code != ldap.LDAPResultBusy {
				t.Errorf("rebind with acme's nodes full: result %d, want busy (51)", code)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, conn := range failed {
		if id := whoAmI(t, conn); id != "" {
			t.Fatalf("a refused connection is %q on its node: the bind reached it", id)
		}
		if node, err := searchOn(conn); err != nil || node != failedOn[i] {
			t.Fatalf("a refused connection: %q, %v (was on %s)", node, err, failedOn[i])
		}
	}
	v := adminView(t, c)
	if v.OpenConnections[own[0]] != 4 || v.OpenConnections[own[1]] != 4 || v.BusyRefusals != 4 || v.UnauthenticatedConnections != 4 ||
		v.Tenants["acme"].AuthenticatedConnections != 8 {
		t.Fatalf("after 4 refused rebinds: counts %v, busy %d, unauthenticated %d, acme %+v",
			v.OpenConnections, v.BusyRefusals, v.UnauthenticatedConnections, v.Tenants["acme"])
	}
	if n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_busy_refusals_total{handler="ldap"}`); n != 4 {
		t.Fatalf("busy refusals metric %v, want 4", n)
	}
	c.WaitLog(t, "the connection's node is at max_per_node: bind refused busy", 5*time.Second)

	// A slot frees on the first refused connection's node: it binds now.
	for _, b := range held {
		if b.node == failedOn[0] {
			b.conn.Close()
			break
		}
	}
	addrOf := map[string]string{}
	for a, n := range names {
		addrOf[n] = a
	}
	waitView(t, c, "the freed slot", func(v viewT) bool { return v.OpenConnections[addrOf[failedOn[0]]] == 3 })
	if err := failed[0].Bind("uid=alice,o=acme,dc=example", "pw-acme"); err != nil {
		t.Fatalf("rebind with room on its node: %v", err)
	}
	if id := whoAmI(t, failed[0]); id != "dn:uid=alice,o=acme,dc=example" {
		t.Fatalf("after the admitted rebind the node holds %q", id)
	}
	if v := adminView(t, c); v.OpenConnections[addrOf[failedOn[0]]] != 4 || v.UnauthenticatedConnections != 3 {
		t.Fatalf("after the admitted rebind: %v, unauthenticated %d", v.OpenConnections, v.UnauthenticatedConnections)
	}

	// auto's max raised by a reload: acme's nodes are full, so a rebind
	// grows it a step before it is refused (its own node is still full).
	c.Reload(t, "caddyfile", config(3))
	waitView(t, c, "max 3", func(v viewT) bool { return v.AutoPartitions != nil && v.AutoPartitions.Max == 3 })
	if code := resultCode(failed[1].Bind("uid=alice,o=acme,dc=example", "pw-acme")); code != ldap.LDAPResultBusy {
		t.Fatalf("rebind on a full node after the reload: result %d, want busy (51)", code)
	}
	if at := adminView(t, c).Tenants["acme"]; at.Partitions != 3 || !strings.Contains(at.PartitionsChangeReason, "max_per_node") {
		t.Fatalf("acme after a rebind found all its nodes full: %+v", at)
	}
	conn, err := ldap.DialURL("ldap://" + front)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if node := marker(t, conn, "acme"); node != names[own[2]] {
		t.Fatalf("a new connection of acme reached %s, want its third node %s", node, names[own[2]])
	}
	s.check(t, 4)
}

// A burst: 50 connections whose first bind failed while there was room
// (sent 20 at a time, so they spread over the tenant's two nodes), then
// all at once alternating right and wrong binds, 20 each (half starting
// with each), on a tenant whose two nodes hold 10 each (k at auto's max).
// The admin view, polled throughout, never shows a node past the ceiling;
// every bind is answered (success, invalid credentials, or busy for a
// connection that did not count) and no connection is closed; once the binds are over each node counts exactly
// the connections whose last bind succeeded on it, by which slapd answers.
func TestRebindBurstKeepsTheCeiling(t *testing.T) {
	e2e.SkipShort(t)
	addrs, names := startNodes(t, 3, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", autoConfig(front, addrs, `auto_partitions {
						target_per_node 100
						max 2
					}
					max_per_node 10
					max_failed_binds 100`))
	c.WaitTCP(t, front)
	s := sample(t, c)
	const n, rounds = 50, 20
	conns := make([]*ldap.Conn, n)
	for i := range conns {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns[i] = conn
	}
	bind := func(conn *ldap.Conn, password string) int {
		return resultCode(conn.Bind("uid=alice,o=acme,dc=example", password))
	}
	for from := 0; from < n; from += 20 {
		var wg sync.WaitGroup
		for _, conn := range conns[from:min(from+20, n)] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code := bind(conn, "wrong"); code != ldap.LDAPResultInvalidCredentials {
					t.Errorf("first bind, wrong password: result %d", code)
				}
			}()
		}
		wg.Wait()
	}
	if t.Failed() {
		t.FailNow()
	}
	bound := make([]bool, n)  // the last bind succeeded
	refused := make([]int, n) // binds answered busy
	e2e.Together(len(conns), func(i int) {
		conn := conns[i]
		for r := range rounds {
			password := "pw-acme"
			if (i+r)%2 == 0 {
				password = "wrong"
			}
			switch code := bind(conn, password); {
			case code == 0 && password == "pw-acme":
				bound[i] = true
			case code == ldap.LDAPResultInvalidCredentials && password == "wrong":
				bound[i] = false
			case code == ldap.LDAPResultBusy && !bound[i]:
				// any bind on a connection that does not count
				// (a wrong one too) needs a slot while in flight
				refused[i]++
			default:
				t.Errorf("connection %d, bind %d with %q: result %d", i, r+1, password, code)
				return
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	want := map[string]int64{}
	var unauth int64
	nbound, nrefused := 0, 0
	for i, conn := range conns {
		nrefused += refused[i]
		node, err := searchOn(conn) // anonymous or bound, the node answers
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if bound[i] {
			want[addrOfName(names, node)]++
			nbound++
		} else {
			unauth++
		}
	}
	v := waitView(t, c, fmt.Sprintf("counts %v", want), func(v viewT) bool {
		for _, a := range addrs {
			if v.OpenConnections[a] != want[a] {
				return false
			}
		}
		return v.UnauthenticatedConnections == unauth
	})
	t.Logf("%d connections: %d bound at the end, %d open unauthenticated, %d binds refused busy; counts %v",
		n, nbound, unauth, nrefused, v.OpenConnections)
	s.check(t, 10)
	if nrefused == 0 || uint64(nrefused) != v.BusyRefusals {
		t.Fatalf("busy refusals: %d answered, %d in the admin view", nrefused, v.BusyRefusals)
	}
}
