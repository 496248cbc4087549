package tenantroute_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/caddymodules/tenantroute"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

var tenants = []string{"acme", "globex", "initech", "umbrella"}

// ldif holds every tenant with one user, and the node's marker entry.
func ldif(node string) string { return ldifWith(node, tenants) }

// ldifWith is ldif for other tenants.
func ldifWith(node string, tenants []string) string {
	var b strings.Builder
	b.WriteString("dn: dc=example\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: example\n\n")
	fmt.Fprintf(&b, "dn: cn=marker,dc=example\nobjectClass: organizationalRole\ncn: marker\ndescription: %s\n\n", node)
	for _, t := range tenants {
		fmt.Fprintf(&b, "dn: o=%s,dc=example\nobjectClass: organization\no: %s\n\n", t, t)
		fmt.Fprintf(&b, "dn: uid=alice,o=%s,dc=example\nobjectClass: inetOrgPerson\nuid: alice\ncn: Alice\nsn: A\nuserPassword: pw-%s\n\n", t, t)
	}
	return b.String()
}

// ldifWithCandidates is ldifWith for the candidate tenants.
func ldifWithCandidates(node string) string { return ldifWith(node, candidates()) }

// startNodes starts n slapd nodes, node-1…node-n, each with data(name), and
// returns their addresses in order and their names by address.
func startNodes(t *testing.T, n int, data func(name string) string) ([]string, map[string]string) {
	t.Helper()
	var addrs []string
	names := map[string]string{}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("node-%d", i)
		s := e2e.StartSlapd(t, name, data(name))
		names[s.Addr] = name
		addrs = append(addrs, s.Addr)
	}
	return addrs, names
}

// marker binds as the tenant's user through the router and returns which
// node answered.
func marker(t *testing.T, conn *ldap.Conn, tenant string) string {
	t.Helper()
	if err := conn.Bind(fmt.Sprintf("uid=alice,o=%s,dc=example", tenant), "pw-"+tenant); err != nil {
		t.Fatalf("bind %s: %v", tenant, err)
	}
	res, err := conn.Search(ldap.NewSearchRequest("cn=marker,dc=example", ldap.ScopeBaseObject, ldap.NeverDerefAliases,
		0, 0, false, "(objectClass=*)", []string{"description"}, nil))
	if err != nil || len(res.Entries) != 1 {
		t.Fatalf("search: %v", err)
	}
	return res.Entries[0].GetAttributeValue("description")
}

// hold opens n connections through front bound as tenant and counts them
// per node reached; the caller closes them.
func hold(t *testing.T, front, tenant string, n int) (map[string]int, []*ldap.Conn) {
	t.Helper()
	per := map[string]int{}
	var conns []*ldap.Conn
	for range n {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		per[marker(t, conn, tenant)]++
	}
	return per, conns
}

// Three slapd nodes, k = 2: each tenant's connections land on its two
// rendezvous nodes (ldapsearch and go-ldap clients), spread evenly; a
// rebind to another tenant is refused; a killed node's tenants fail over.
func TestTenantRoutingWithSlapd(t *testing.T) {
	if _, err := exec.LookPath("slapd"); err != nil {
		t.Fatal("slapd is needed (Debian package slapd; make test installs it)")
	}
	var addrs []string
	nodes := map[string]*e2e.Slapd{}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node-%d", i)
		s := e2e.StartSlapd(t, name, ldif(name))
		nodes[s.Addr] = s
		addrs = append(addrs, s.Addr)
	}
	nameOf := func(addr string) string { return nodes[addr].Name }
	front := e2e.Addr(t)
	// The static example, with its addresses replaced.
	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "ldap-tenant-routing.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	c := e2e.StartCaddy(t, "caddyfile", strings.NewReplacer("127.0.0.1:3389", front,
		"127.0.0.1:3891", addrs[0], "127.0.0.1:3892", addrs[1], "127.0.0.1:3893", addrs[2]).Replace(string(example)))
	c.WaitTCP(t, front)

	// ldapsearch, the real client.
	own := placement.Rank("acme", addrs)[:2]
	out, err := exec.Command("ldapsearch", "-x", "-H", "ldap://"+front, "-D", "uid=alice,o=acme,dc=example", "-w", "pw-acme",
		"-b", "cn=marker,dc=example", "-s", "base", "description").CombinedOutput()
	if err != nil {
		t.Fatalf("ldapsearch: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "description: "+nameOf(own[0])) && !strings.Contains(string(out), "description: "+nameOf(own[1])) {
		t.Fatalf("acme answered by a node outside %v:\n%s", own, out)
	}

	// 90 held connections per tenant: always on the tenant's nodes, and
	// least connections spreads them (max/mean ≤ 1.1 over its 2 nodes).
	for _, tenant := range tenants {
		own := placement.Rank(tenant, addrs)[:2]
		per, conns := hold(t, front, tenant, 90)
		for n, cnt := range per {
			if !slices.ContainsFunc(own, func(a string) bool { return nameOf(a) == n }) {
				t.Fatalf("tenant %s reached %s, not one of its nodes %v", tenant, n, own)
			}
			if float64(cnt)/45 > 1.1 {
				t.Fatalf("tenant %s spread %v: max/mean over 1.1", tenant, per)
			}
		}
		if tenant == "acme" {
			v := adminView(t, c)
			at := v.Tenants["acme"]
			if at.Connections != 90 || !slices.Equal(at.Nodes, own) || v.Membership != "static" {
				t.Fatalf("admin view of acme: %+v (want 90 connections on %v)", at, own)
			}
			if v.OpenConnections[own[0]] != 45 || v.OpenConnections[own[1]] != 45 {
				t.Fatalf("open connections %v", v.OpenConnections)
			}
		}
		for _, conn := range conns {
			conn.Close()
		}
	}

	// A run-time change of one tenant's partitions (an operator giving a
	// hot tenant more nodes): acme now spans all three nodes.
	body := strings.NewReader(`{"handler": "ldap", "tenant": "acme", "partitions": 3}`)
	resp, err := http.Post("http://"+c.Admin+"/tenant_route/partitions", "application/json", body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("setting partitions: %v %v", err, resp.Status)
	}
	resp.Body.Close()
	// 300 connections of acme with k=3: least connections spreads them
	// over the three nodes, max/mean ≤ 1.1.
	seen, held := hold(t, front, "acme", 300)
	for _, conn := range held {
		conn.Close()
	}
	if len(seen) != 3 {
		t.Fatalf("with 3 partitions acme reached %v", seen)
	}
	for _, cnt := range seen {
		if float64(cnt)/100 > 1.1 {
			t.Fatalf("300 acme connections with k=3 spread %v: max/mean over 1.1", seen)
		}
	}

	// Rebind to another tenant on the same connection: refused (closed).
	conn, err := ldap.DialURL("ldap://" + front)
	if err != nil {
		t.Fatal(err)
	}
	marker(t, conn, "acme")
	conn.SetTimeout(5 * time.Second)
	if err := conn.Bind("uid=alice,o=globex,dc=example", "pw-globex"); err == nil {
		t.Fatal("a rebind to another tenant succeeded")
	} else {
		t.Logf("rebind refused: %v", err)
	}
	conn.Close()
	c.WaitLog(t, "bind to another tenant on a routed connection", 5*time.Second)
	resp, err = http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`caddy_edgesteer_tenant_route_refused_rebinds_total{handler="ldap"} 1`,
		`caddy_edgesteer_tenant_route_connections_total{handler="ldap",node="` + own[0] + `"}`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The example's other route: StartTLS-first and anonymous connections
	// go to node 1 (tenant_route would refuse them). ldapsearch -Z asks for
	// StartTLS first and goes on in the clear when the node (slapd without
	// TLS here) declines, on the same connection: the search's answer names
	// the node that got the StartTLS request.
	for _, args := range [][]string{{"-Z"}, {}} {
		cmd := exec.Command("ldapsearch", append(args, "-x", "-H", "ldap://"+front, "-b", "cn=marker,dc=example",
			"-s", "base", "description")...)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "description: node-1\n") {
			t.Fatalf("anonymous ldapsearch %v: want node-1: %v\n%s", args, err, out)
		}
		if len(args) > 0 && !strings.Contains(string(out), "ldap_start_tls") {
			t.Fatalf("ldapsearch -Z sent no StartTLS:\n%s", out)
		}
	}

	// Kill acme's first node, with acme back at k = 2 and nothing open (so
	// its first node would be picked): every connection goes to the next
	// node in rendezvous order, and the killed node is dialled once only,
	// then skipped for its cool-off (30 s in the example).
	body = strings.NewReader(`{"handler": "ldap", "tenant": "acme", "partitions": 0}`)
	if resp, err = http.Post("http://"+c.Admin+"/tenant_route/partitions", "application/json", body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("resetting partitions: %v %v", err, resp.Status)
	}
	resp.Body.Close()
	waitView(t, c, "acme at k=2 and nothing open", func(v viewT) bool {
		for _, n := range v.OpenConnections {
			if n != 0 {
				return false
			}
		}
		return v.TenantPartitions["acme"] == 0
	})
	nodes[own[0]].Kill()
	for range 5 {
		conn, err := ldap.DialURL("ldap://" + front)
		if err != nil {
			t.Fatal(err)
		}
		if n := marker(t, conn, "acme"); n != nameOf(own[1]) {
			t.Fatalf("with %s killed acme reached %s, want the next node %s", nameOf(own[0]), n, nameOf(own[1]))
		}
		conn.Close()
	}
	failures, _ := c.Metric(t, `caddy_edgesteer_tenant_route_dial_failures_total{handler="ldap",node="`+own[0]+`"}`)
	if failures != 1 {
		t.Fatalf("dial failures of the killed node: %v, want 1 (then cooled off)", failures)
	}
	c.WaitLog(t, "node unreachable: cooling off", 5*time.Second)
}

func adminView(t *testing.T, c *e2e.Caddy) tenantroute.View {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/tenant_route/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v []tenantroute.View
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || len(v) != 1 {
		t.Fatalf("admin view: %v %+v", err, v)
	}
	return v[0]
}

// The tenant from a placeholder: a listener per tenant, {l4.conn.local_addr}
// names it. Anonymous ldapsearch (no bind at all) reaches only the
// listener's tenant's node, k = 1.
func TestTenantFromPlaceholder(t *testing.T) {
	addrs, nodes := startNodes(t, 3, ldif)
	fronts := []string{e2e.Addr(t), e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)}
	var servers strings.Builder
	for _, f := range fronts {
		fmt.Fprintf(&servers, "\t\t%s {\n\t\t\troute {\n\t\t\t\ttenant_route {\n\t\t\t\t\tnodes %s\n\t\t\t\t\tpartitions 1\n"+
			"\t\t\t\t\ttenant {l4.conn.local_addr}\n\t\t\t\t}\n\t\t\t}\n\t\t}\n", f, strings.Join(addrs, " "))
	}
	c := e2e.StartCaddy(t, "caddyfile", "{\n\tlayer4 {\n"+servers.String()+"\t}\n}\n")
	for _, f := range fronts {
		c.WaitTCP(t, f)
		want := nodes[placement.Rank(f, addrs)[0]]
		for range 3 {
			out, err := exec.Command("ldapsearch", "-x", "-H", "ldap://"+f, "-b", "cn=marker,dc=example", "-s", "base",
				"description").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "description: "+want+"\n") {
				t.Fatalf("anonymous ldapsearch via %s: want %s: %v\n%s", f, want, err, out)
			}
		}
	}
}

// With the tenant from a placeholder the first message may be any
// operation: a search first (no bind) is answered whole, and the node's
// stream is framed from its first message on, so a bind and a search after
// it are answered too, on the same node, and the connection counts on it.
func TestPlaceholderTenantSearchFirst(t *testing.T) {
	e2e.SkipShort(t)
	addrs, names := startNodes(t, 2, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf("{\n\tlayer4 {\n\t\t%s {\n\t\t\troute {\n\t\t\t\ttenant_route {\n"+
		"\t\t\t\t\tname ldap\n\t\t\t\t\tnodes %s\n\t\t\t\t\tpartitions 1\n\t\t\t\t\ttenant {l4.conn.local_addr}\n"+
		"\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n", front, strings.Join(addrs, " ")))
	c.WaitTCP(t, front)
	want := names[placement.Rank(front, addrs)[0]]
	conn, err := ldap.DialURL("ldap://" + front)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range 3 {
		if i == 1 {
			if err := conn.Bind("uid=alice,o=acme,dc=example", "pw-acme"); err != nil {
				t.Fatalf("bind after a search: %v", err)
			}
		}
		if node, err := searchOn(conn); err != nil || node != want {
			t.Fatalf("search %d: %q, %v; want %s", i+1, node, err, want)
		}
	}
	if v := adminView(t, c); v.OpenConnections[placement.Rank(front, addrs)[0]] != 1 {
		t.Fatalf("counts %v", v.OpenConnections)
	}
}

// LDAPS: caddy-l4's tls handler first (certificates from Caddy's internal
// CA), the tenant from the TLS server name. go-ldap dials with TLS and SNI.
func TestLDAPSWithTenantFromServerName(t *testing.T) {
	addrs, nodes := startNodes(t, 3, ldif)
	front, site := e2e.Addr(t), e2e.FreePort(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	skip_install_trust
	layer4 {
		%s {
			route {
				tls
				tenant_route {
					nodes %s
					partitions 1
					tenant {l4.tls.server_name}
				}
			}
		}
	}
}
# A site for the same names makes Caddy keep certificates for them.
https://acme.example:%d, https://globex.example:%d {
	bind 127.0.0.1
	tls internal
	respond ok
}`, front, strings.Join(addrs, " "), site, site))
	c.WaitTCP(t, front)
	for _, tenant := range []string{"acme", "globex"} {
		sni := tenant + ".example"
		want := nodes[placement.Rank(sni, addrs)[0]]
		var conn *ldap.Conn
		c.WaitFor(t, "a certificate for "+sni, 30*time.Second, func() error {
			var err error
			conn, err = ldap.DialURL("ldaps://"+front, ldap.DialWithTLSConfig(&tls.Config{ServerName: sni, InsecureSkipVerify: true}))
			if err == nil {
				err = conn.Bind(fmt.Sprintf("uid=alice,o=%s,dc=example", tenant), "pw-"+tenant)
				if err != nil {
					conn.Close()
				}
			}
			return err
		})
		state, _ := conn.TLSConnectionState()
		if got := state.PeerCertificates[0].DNSNames; !slices.Contains(got, sni) {
			t.Fatalf("certificate for %v, want %s", got, sni)
		}
		res, err := conn.Search(ldap.NewSearchRequest("cn=marker,dc=example", ldap.ScopeBaseObject, ldap.NeverDerefAliases,
			0, 0, false, "(objectClass=*)", []string{"description"}, nil))
		conn.Close()
		if err != nil || len(res.Entries) != 1 || res.Entries[0].GetAttributeValue("description") != want {
			t.Fatalf("LDAPS as %s: want %s: %v %+v", sni, want, err, res)
		}
	}
	// Behind caddy-l4's tls handler the socket cannot be handed over: the
	// connections were relayed in place, and the metric says so.
	if got := relaysByMode(t, c); got["in_place"] < 2 || got["handed_over"] != 0 {
		t.Fatalf("relays by mode %v, want 2 or more in_place and none handed_over", got)
	}
}

// relaysByMode sums caddy_edgesteer_tenant_route_relays_total by mode.
func relaysByMode(t *testing.T, c *e2e.Caddy) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "caddy_edgesteer_tenant_route_relays_total{") {
			continue
		}
		var v float64
		mode := line[strings.Index(line, `mode="`)+len(`mode="`):]
		mode = mode[:strings.Index(mode, `"`)]
		fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
		out[mode] += v
	}
	return out
}

// caddy-l4's matching_timeout bounds the wait for the first message with
// the ldap matcher in front: a client that sends only part of its bind is
// disconnected without reaching a node; a whole bind still goes through.
func TestIncompleteFirstMessageCutOff(t *testing.T) {
	s := e2e.StartSlapd(t, "node-1", ldif("node-1"))
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`{
	layer4 {
		%s {
			matching_timeout 1s
			@bind ldap {
				operation bind
			}
			route @bind {
				tenant_route {
					nodes %s
				}
			}
		}
	}
}`, front, s.Addr))
	c.WaitTCP(t, front)
	conn, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The first 10 bytes of a simple bind of uid=alice,o=acme,dc=example.
	if _, err := conn.Write([]byte{0x30, 0x38, 0x02, 0x01, 0x01, 0x60, 0x33, 0x02, 0x01, 0x03}); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an incomplete first message was not cut off: %d bytes, %v", n, err)
	}
	c.WaitLog(t, "aborted matching according to timeout", 5*time.Second)
	if n, _ := c.Metric(t, `caddy_edgesteer_tenant_route_connections_total{`); n != 0 {
		t.Fatalf("the cut-off connection was routed")
	}
	full, _ := ldap.DialURL("ldap://" + front)
	defer full.Close()
	if node := marker(t, full, "acme"); node != "node-1" {
		t.Fatalf("a whole bind reached %q", node)
	}
}
