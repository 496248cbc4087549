package tenantroute_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// goroutines reads bin/caddy's goroutine count from its admin pprof.
func goroutines(t *testing.T, c *e2e.Caddy) int {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	var n int
	if _, serr := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil || serr != nil {
		t.Fatalf("goroutine profile: %q %v %v", line, err, serr)
	}
	return n
}

// Idle routed connections hold no goroutine in the router (the relay
// watches their sockets in an epoll set, README "Idle connections"):
// 200 connections bound and searched at once through bin/caddy, left
// idle, used again at once, then closed. Once the connections have been
// silent for relay.Linger, Caddy's goroutines have grown by far less than
// one per connection (a relay in place holds two), every
// connection answers again after its idle spell, and once they are closed
// the router counts none open (each relay's end was seen).
func TestIdleConnectionsHoldNoGoroutine(t *testing.T) {
	e2e.SkipShort(t)
	addrs, _ := startNodes(t, 2, ldif)
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", ldapRouter(front, addrs, "partitions 2"))
	c.WaitTCP(t, front)

	// One connection first: goroutines started once per process (the
	// relay's epoll sets, the pool of the metrics) are in the baseline.
	warm, err := ldap.DialURL("ldap://" + front)
	if err != nil {
		t.Fatal(err)
	}
	marker(t, warm, "acme")
	warm.Close()
	waitIdle(t, c)
	before := goroutines(t, c)

	const n = 200
	conns := make([]*ldap.Conn, n)
	burst := func(what string, do func(i int) error) {
		e2e.Together(len(conns), func(i int) {
			if err := do(i); err != nil {
				t.Errorf("%s %d: %v", what, i, err)
			}
		})
		if t.Failed() {
			t.FailNow()
		}
	}
	search := func(i int) error {
		tenant := tenants[i%len(tenants)]
		if err := conns[i].Bind("uid=alice,o="+tenant+",dc=example", "pw-"+tenant); err != nil {
			return err
		}
		node, err := searchOn(conns[i])
		if err == nil && !strings.HasPrefix(node, "node-") {
			err = fmt.Errorf("answered by %q", node)
		}
		return err
	}
	burst("connect", func(i int) (err error) {
		conns[i], err = ldap.DialURL("ldap://" + front)
		if err != nil {
			return err
		}
		return search(i)
	})
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	// A direction that had something to say keeps a goroutine until it
	// has been silent for relay.Linger (1 s): wait for them to go.
	settled := func() int {
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := goroutines(t, c)
			if got-before < n/4 || time.Now().After(deadline) {
				return got
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	held := settled()
	burst("search again", search)
	busy := goroutines(t, c)
	again := settled()
	t.Logf("bin/caddy goroutines: %d before, %d with %d idle routed connections, %d just after they searched again, %d once idle again",
		before, held, n, busy, again)
	for _, got := range []int{held, again} {
		if got-before >= n/4 {
			t.Fatalf("%d goroutines more with %d idle routed connections than without: the relay holds goroutines per connection",
				got-before, n)
		}
	}
	if got := relaysByMode(t, c); got["handed_over"] != n+1 || got["in_place"] != 0 {
		t.Fatalf("relays by mode %v, want %d handed_over and none in_place", got, n+1)
	}
	open := int64(0)
	for _, k := range adminView(t, c).OpenConnections {
		open += k
	}
	if open != n {
		t.Fatalf("the router counts %d open connections, want %d", open, n)
	}
	for _, conn := range conns {
		conn.Close()
	}
	waitIdle(t, c)
}
