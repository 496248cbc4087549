package ogs_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// httpsGateway serves HTTPS on addr (httptest's certificate; the probe does
// not check it), answering after its delay.
func httpsGateway(t *testing.T, addr string, delay time.Duration) *atomic.Int64 {
	t.Helper()
	d := new(atomic.Int64)
	d.Store(int64(delay))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(time.Duration(d.Load()))
		fmt.Fprintln(w, "ok")
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return d
}

// startUnbound runs Debian's unbound in the foreground with a config of its
// own (never the system service): ECS towards CoreDNS at upstream through
// its subnetcache module, and each zone a primed stub zone there.
func startUnbound(t *testing.T, upstream string, zones ...string) (*e2e.Proc, string) {
	t.Helper()
	addr := e2e.Addr(t)
	bin, conf := e2e.Unbound{Listen: addr, Allow: "127.0.0.0/8", Upstream: upstream, Zones: zones, Prime: true, Verbosity: 3}.WriteConfig(t, t.TempDir())
	p := e2e.Start(t, "unbound", bin, nil, "-d", "-c", conf)
	p.WaitFor(t, "unbound answering", 30*time.Second, func() error {
		_, err := resolve(addr, "127.0.0.1", zones[0], dns.TypeSOA)
		return err
	})
	return p, addr
}

// resolve asks the resolver at addr from the source address src, as a stub
// resolver does: no ECS of its own, one try, dig's and glibc's 5 s.
func resolve(addr, src, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Timeout: 5 * time.Second, Dialer: &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// Clients ask their recursive resolver, which asks CoreDNS: Debian's
// unbound with its subnetcache module (EDNS Client Subnet) in front of
// bin/coredns serving Corefile.examples/ogs.Corefile as a primed stub zone,
// with one of the four gateways dropping SYNs.
//
//   - The first query of a new location is answered (unbound drops a reply
//     still pending after its 1.9 s discard-timeout): with the gateways
//     heard from so far and the short fallback TTL; later ones with the
//     measured order and the full TTL.
//   - Clients of two /24s get their own location's optimal gateway.
//   - The example's `records 1` puts the optimal gateway first in every
//     answer (20 per location), while a full list is rotated by unbound, and
//     SRV priorities keep the order.
//   - NXDOMAIN and NODATA carry the SOA and unbound caches them: a second
//     query within the SOA minimum does not reach CoreDNS; unbound accepts
//     ogs' ECS on them (no "Authority indicates no support").
//   - No SERVFAIL anywhere.
func TestThroughUnbound(t *testing.T) {
	if !e2e.InNamespace(t) {
		return
	}
	delays := []*atomic.Int64{
		// Delays far apart: concurrent TLS handshakes on a busy machine
		// add tens of milliseconds of their own.
		httpsGateway(t, "127.0.0.11:8443", 300*ms),
		httpsGateway(t, "127.0.0.12:8443", 10*ms),
		httpsGateway(t, "127.0.0.13:8443", 0),
		httpsGateway(t, "127.0.0.14:8443", 150*ms),
	}
	nftDrop(t, "127.0.0.13:8443", "tcp flags & (syn|ack) == syn")

	example, err := os.ReadFile(filepath.Join(e2e.Root(t), "Corefile.examples", "ogs.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	cf := regexp.MustCompile(`cache_file \S+`).ReplaceAllString(string(example), "cache_file "+filepath.Join(t.TempDir(), "ogs.json"))
	// The same gateways with every record, A and SRV: what unbound does to
	// an order carried by several records.
	cf += `
all.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test 127.0.0.11:8443
		gateway gw2.example.test 127.0.0.12:8443 backup gw3.example.test
		gateway gw3.example.test 127.0.0.13:8443
		gateway gw4.example.test 127.0.0.14:8443
		srv
	}
}
`
	// Port 53 (the test has the namespace to itself): a primed stub zone
	// follows the zone's NS records, whose glue carries no port.
	d := startCoreDNSOn53(t, cf)
	ub, resolver := startUnbound(t, d.Addr, "vpn.example.test", "all.example.test")
	u := viaUnbound{t, resolver}

	// Location A (127.0.1.0/24): gw2 (10 ms) is optimal; gw3 drops SYNs, so
	// its probes run to their 2 s timeout, past the 1.5 s answer deadline.
	const a, b = "127.0.1.10", "127.0.2.10"
	if ip, ttl := u.first(a); ip != "127.0.0.12" || ttl > 5 {
		t.Fatalf("location A's first answer: %s TTL %d, want gw2 with the 5 s fallback TTL", ip, ttl)
	}
	u.measured(a, "127.0.0.12")

	// The network changes; location B (127.0.2.0/24) measures gw1 optimal.
	delays[0].Store(int64(10 * ms))
	delays[1].Store(int64(300 * ms))
	if ip, ttl := u.first(b); ip != "127.0.0.11" || ttl > 5 {
		t.Fatalf("location B's first answer: %s TTL %d, want gw1 with the 5 s fallback TTL", ip, ttl)
	}
	u.measured(b, "127.0.0.11")
	for range 20 {
		for src, want := range map[string]string{a: "127.0.0.12", b: "127.0.0.11"} {
			if ip, _ := u.first(src); ip != want {
				t.Fatalf("from %s: %s, want its own location's optimal gateway %s", src, ip, want)
			}
		}
	}

	checkSeveralRecordsThroughUnbound(u, b)

	// The apex: SOA and NS through unbound.
	if r := u.ask(a, "vpn.example.test", dns.TypeSOA); len(r.Answer) != 1 || r.Answer[0].Header().Rrtype != dns.TypeSOA {
		t.Fatalf("SOA through unbound:\n%v", r)
	}
	if r := u.ask(a, "vpn.example.test", dns.TypeNS); len(r.Answer) != 1 || r.Answer[0].(*dns.NS).Ns != "ns.dns.vpn.example.test." {
		t.Fatalf("NS through unbound:\n%v", r)
	}

	checkNegativeCachedByUnbound(u, d, a)
	if strings.Contains(ub.Logs(), "Authority indicates no support") {
		t.Fatalf("unbound found no ECS support:\n%s", grepLines(ub.Logs(), "subnet"))
	}
}

// viaUnbound asks the resolver (unbound) as a client of a source address.
type viaUnbound struct {
	t        *testing.T
	resolver string
}

// ask fails the test on no answer or SERVFAIL.
func (u viaUnbound) ask(src, name string, qtype uint16) *dns.Msg {
	u.t.Helper()
	r, err := resolve(u.resolver, src, name, qtype)
	if err != nil {
		u.t.Fatalf("%s %s from %s: no answer through unbound: %v", name, dns.TypeToString[qtype], src, err)
	}
	if r.Rcode == dns.RcodeServerFailure {
		u.t.Fatalf("%s %s from %s: SERVFAIL:\n%v", name, dns.TypeToString[qtype], src, r)
	}
	return r
}

// first is the one A record of vpn.example.test (records 1) and its TTL.
func (u viaUnbound) first(src string) (string, uint32) {
	u.t.Helper()
	ips, ttl := aRecords(u.ask(src, "vpn.example.test", dns.TypeA))
	if len(ips) != 1 {
		u.t.Fatalf("from %s: %v, want one record (records 1)", src, ips)
	}
	return ips[0], ttl
}

// measured waits for src's answer with a measured order (a TTL above the
// fallback's) and checks that it is want.
func (u viaUnbound) measured(src, want string) {
	u.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * ms) {
		ip, ttl := u.first(src)
		if ttl > 5 {
			if ip != want {
				u.t.Fatalf("from %s, measured: %s, want %s", src, ip, want)
			}
			return
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("from %s: still the fallback answer (%s TTL %d)", src, ip, ttl)
		}
	}
}

// checkSeveralRecordsThroughUnbound: with several A records unbound
// rotates them, so the order is lost; SRV priorities keep it.
func checkSeveralRecordsThroughUnbound(u viaUnbound, b string) {
	u.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * ms) {
		if _, ttl := aRecords(u.ask(b, "all.example.test", dns.TypeA)); ttl > 5 {
			break
		}
		if time.Now().After(deadline) {
			u.t.Fatal("all.example.test never answered with a measured order")
		}
	}
	firstOfFull := 0
	for range 20 {
		ips, _ := aRecords(u.ask(b, "all.example.test", dns.TypeA))
		if len(ips) != 4 {
			u.t.Fatalf("all.example.test: %v, want 4 records", ips)
		}
		if ips[0] == "127.0.0.11" {
			firstOfFull++
		}
		srv := u.ask(b, "all.example.test", dns.TypeSRV).Answer
		best := slices.MinFunc(srv, func(x, y dns.RR) int { return int(x.(*dns.SRV).Priority) - int(y.(*dns.SRV).Priority) })
		if len(srv) != 4 || best.(*dns.SRV).Target != "gw1.example.test." {
			u.t.Fatalf("SRV through unbound: lowest priority %v, want gw1:\n%v", best, srv)
		}
	}
	if firstOfFull == 20 {
		u.t.Fatal("unbound never rotated the four A records: this test no longer shows why records 1 is needed")
	}
	u.t.Logf("the optimal gateway came first in %d of 20 four-record answers through unbound", firstOfFull)
}

// checkNegativeCachedByUnbound: negative answers carry the SOA in
// authority, and unbound caches them for the SOA minimum (the example's
// ttl, 30 s), so a second query does not reach CoreDNS.
func checkNegativeCachedByUnbound(u viaUnbound, d *e2e.CoreDNS, a string) {
	u.t.Helper()
	for _, q := range []struct {
		name  string
		qtype uint16
		rcode int
		logAs string
	}{
		{"nope.vpn.example.test", dns.TypeA, dns.RcodeNameError, "A IN nope.vpn.example.test."},
		{"vpn.example.test", dns.TypeMX, dns.RcodeSuccess, "MX IN vpn.example.test."},
	} {
		for i := range 2 {
			r := u.ask(a, q.name, q.qtype)
			soa, ok := firstSOA(r)
			if r.Rcode != q.rcode || len(r.Answer) != 0 || !ok || soa.Hdr.Ttl > 30 || soa.Minttl != 30 {
				u.t.Fatalf("%s %s (query %d): want rcode %d with the SOA (minimum 30) in authority:\n%v", q.name, dns.TypeToString[q.qtype], i+1, q.rcode, r)
			}
		}
		// CoreDNS logs each query after answering it, so on a busy host a
		// query's line may follow a later query's: wait for the first
		// line, then for a query sent after that one's, before counting.
		count := func() int { return strings.Count(strings.ToLower(d.Logs()), strings.ToLower(q.logAs)) }
		for deadline := time.Now().Add(10 * time.Second); count() == 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		for i := range 2 {
			marker := fmt.Sprintf("marker-%d-%d.vpn.example.test", q.qtype, i)
			if _, err := d.Exchange(marker, dns.TypeA); err != nil {
				u.t.Fatal(err)
			}
			d.WaitLog(u.t, marker+".", 10*time.Second)
		}
		if n := count(); n != 1 {
			u.t.Fatalf("%s reached CoreDNS %d times, want once (the second answered from unbound's cache)", q.logAs, n)
		}
	}
}

// startCoreDNSOn53 runs bin/coredns on 127.0.0.1:53, where the shared
// harness picks a free port.
func startCoreDNSOn53(t *testing.T, corefile string) *e2e.CoreDNS {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &e2e.CoreDNS{Proc: e2e.Start(t, "coredns", e2e.Bin(t, "coredns"), nil, "-conf", path, "-dns.port", "53"), Addr: "127.0.0.1:53"}
	d.WaitFor(t, "a DNS answer", 30*time.Second, func() error {
		_, err := d.Exchange("vpn.example.test", dns.TypeSOA)
		return err
	})
	return d
}

func firstSOA(r *dns.Msg) (*dns.SOA, bool) {
	for _, rr := range r.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return soa, true
		}
	}
	return nil, false
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
