package ogs_test

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// restartable is a countingGateway whose process can die and come back.
type restartable struct {
	*countingGateway
	srv *http.Server
}

func startRestartable(t *testing.T, ip string, delay time.Duration) *restartable {
	t.Helper()
	r := &restartable{countingGateway: &countingGateway{}}
	r.delay.Store(int64(delay))
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	r.Addr = l.Addr().String()
	r.serve(l)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

func (r *restartable) serve(l net.Listener) {
	r.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			time.Sleep(time.Duration(r.delay.Load()))
			fmt.Fprintln(w, "ok")
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				r.conns.Add(1)
			}
		},
	}
	go r.srv.Serve(l)
}

func (r *restartable) stop() { r.srv.Close() }

func (r *restartable) restart(t *testing.T) {
	l, err := net.Listen("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	r.serve(l)
}

func txtOf(m *dns.Msg) string {
	if len(m.Answer) != 1 {
		return fmt.Sprint(m.Answer)
	}
	return strings.Join(m.Answer[0].(*dns.TXT).Txt, "\n")
}

// Every probe fails fast (the default https probe against plain-HTTP
// gateways): the answer comes at once in configured order, and the log,
// the TXT and the metrics say why, per gateway, without any talk of a
// deadline or of a previous selection the location never had.
func TestFastFailuresSayWhy(t *testing.T) {
	addrs, _ := gateways(t, 0, 0, 0, 0)
	metricsAddr := e2e.Addr(t)
	cf := strings.Replace(corefile(addrs, t.TempDir()+"/ogs.json", metricsAddr, ""), "probe http /", "", 1)
	d := e2e.StartCoreDNS(t, cf, "other.example.test A")

	ips, _ := aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, ""))
	if !slices.Equal(ips, []string{"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"}) {
		t.Fatalf("answer %v, want the configured order", ips)
	}
	txt := txtOf(ask(t, d.Addr, "_ogs.vpn.example.test", dns.TypeTXT, ""))
	for _, want := range []string{
		"No gateway answered the last OGS ping tests",
		"no previous selection, configured order used.",
		"gw1.example.test " + addrs[0] + " RTT(ms) - error protocol",
		"No optimal server: configured order.",
	} {
		if !strings.Contains(txt, want) {
			t.Fatalf("TXT lacks %q:\n%s", want, txt)
		}
	}
	if strings.Contains(txt, "deadline") {
		t.Fatalf("TXT speaks of a deadline:\n%s", txt)
	}
	// The run is logged (and its metrics counted) just after it answered,
	// and the log reaches us through a pipe: wait for it; the last line
	// comes after the metrics.
	for _, want := range []string{
		"OGS ping results for gw2.example.test (location src:127.0.0.0/24): (- - -) last error: protocol: ",
		"no gateway answered for location src:127.0.0.0/24, which has no previous selection: answering in configured order",
	} {
		d.WaitLog(t, want, 10*time.Second)
	}
	if n := metric(t, metricsAddr, `coredns_ogs_probe_failures_total{gateway="gw3.example.test",reason="protocol"}`); n != 3 {
		t.Fatalf("probe_failures_total for gw3/protocol = %v, want 3", n)
	}
	if n := metric(t, metricsAddr, "coredns_ogs_fallbacks_total"); n != 2 {
		t.Fatalf("%v fallbacks, want 2 (the A and the TXT query)", n)
	}
}

// The re-check: a cached first choice that dies moves behind its backup
// with no probe run, and comes back when it answers again. Also: a dead
// backup is left out with `unmeasured omit`, two gateways on one IP give
// one A record, negative answers carry the SOA, SOA and NS answer at the
// apex, and ECS is echoed with scope 0 where the location does not matter.
func TestRecheckOmitDedupeSOAAndECS(t *testing.T) {
	gw1 := startRestartable(t, "127.0.0.11", 1*ms)
	gw2 := startCountingGateway(t, "127.0.0.12", 100*ms)
	gw3 := startCountingGateway(t, "127.0.0.13", 200*ms)
	gw2b := startCountingGateway(t, "127.0.0.12", 300*ms) // gw2's IP, another port
	deadPort := e2e.FreePort(t)                           // nothing listens: a dead backup
	metricsAddr := e2e.Addr(t)
	cf := fmt.Sprintf(`vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1 %s backup gw4 gw3
		gateway gw2 %s
		gateway gw3 %s
		gateway gw4 127.0.0.14:%d
		gateway gw2b %s
		probe http /
		probes 2
		unmeasured omit
		recheck 300ms
	}
	prometheus %s
}
`, gw1.Addr, gw2.Addr, gw3.Addr, deadPort, gw2b.Addr, metricsAddr)
	d := e2e.StartCoreDNS(t, cf, "other.example.test A")
	order := func() []string {
		ips, _ := aRecords(ask(t, d.Addr, "vpn.example.test", dns.TypeA, "10.3.0.0/24"))
		return ips
	}
	// gw1 first, its backups that answered (gw3; gw4 is dead and omitted),
	// then gw2, whose twin gw2b adds no second record.
	if got := order(); !slices.Equal(got, []string{"127.0.0.11", "127.0.0.13", "127.0.0.12"}) {
		t.Fatalf("first answer %v", got)
	}
	runs := metric(t, metricsAddr, "coredns_ogs_probe_runs_total")
	gw3Before := gw3.Conns()

	gw1.stop()
	d.WaitFor(t, "gw1 moved behind its backup", 30*time.Second, func() error {
		if got := order(); !slices.Equal(got, []string{"127.0.0.13", "127.0.0.12"}) {
			return fmt.Errorf("order %v", got)
		}
		return nil
	})
	txt := txtOf(ask(t, d.Addr, "_ogs.vpn.example.test", dns.TypeTXT, "10.3.0.0/24"))
	if !strings.Contains(txt, "Results obtained from OGS cache") || !strings.Contains(txt, "gw1 "+gw1.Addr+" RTT(ms) ") || !strings.Contains(txt, "re-check failed refused omitted") {
		t.Fatalf("TXT with gw1 dead:\n%s", txt)
	}
	gw1.restart(t)
	d.WaitFor(t, "gw1 back first", 30*time.Second, func() error {
		if got := order(); !slices.Equal(got, []string{"127.0.0.11", "127.0.0.13", "127.0.0.12"}) {
			return fmt.Errorf("order %v", got)
		}
		return nil
	})
	if n := metric(t, metricsAddr, "coredns_ogs_probe_runs_total"); n != runs {
		t.Fatalf("%v probe runs during the re-checks", n-runs)
	}
	if n := gw2.Conns() + gw2b.Conns(); n != 4 {
		t.Fatalf("gw2 and gw2b saw %d probes, want the run's 2 each (never first: never re-checked)", n)
	}
	if gw3.Conns() <= gw3Before {
		t.Fatalf("gw3, first while gw1 was dead, was never re-checked")
	}
	if !strings.Contains(d.Logs(), "re-check: gw1, a cached first choice, failed (refused") || !strings.Contains(d.Logs(), "re-check: gw1 answers again") {
		t.Fatalf("re-check not logged:\n%s", d.Logs())
	}

	checkApexNegativeAndScope(t, d.Addr)
}

// checkApexNegativeAndScope checks the apex records, negative answers and
// ECS scope of the server at addr.
func checkApexNegativeAndScope(t *testing.T, addr string) {
	t.Helper()
	for _, tc := range []struct {
		name   string
		qtype  uint16
		rcode  int
		answer uint16 // type of the first answer record, 0: none
		scope  int
	}{
		{"vpn.example.test", dns.TypeA, dns.RcodeSuccess, dns.TypeA, 24},
		{"vpn.example.test", dns.TypeSOA, dns.RcodeSuccess, dns.TypeSOA, 0},
		{"vpn.example.test", dns.TypeNS, dns.RcodeSuccess, dns.TypeNS, 0},
		{"ns.dns.vpn.example.test", dns.TypeA, dns.RcodeSuccess, dns.TypeA, 0},
		{"vpn.example.test", dns.TypeAAAA, dns.RcodeSuccess, 0, 0},
		{"vpn.example.test", dns.TypeMX, dns.RcodeSuccess, 0, 0},
		{"nope.vpn.example.test", dns.TypeA, dns.RcodeNameError, 0, 0},
	} {
		r := ask(t, addr, tc.name, tc.qtype, "10.3.0.0/24")
		got := uint16(0)
		if len(r.Answer) > 0 {
			got = r.Answer[0].Header().Rrtype
		}
		scope := -1
		if opt := r.IsEdns0(); opt != nil {
			for _, o := range opt.Option {
				if s, ok := o.(*dns.EDNS0_SUBNET); ok {
					scope = int(s.SourceScope)
				}
			}
		}
		negSOA := len(r.Answer) > 0 || (len(r.Ns) == 1 && r.Ns[0].Header().Rrtype == dns.TypeSOA && r.Ns[0].Header().Name == "vpn.example.test.")
		if r.Rcode != tc.rcode || got != tc.answer || scope != tc.scope || !negSOA || !r.Authoritative {
			t.Errorf("%s %s: rcode %d answer %s scope %d SOA %v, want rcode %d answer %s scope %d:\n%v",
				tc.name, dns.TypeToString[tc.qtype], r.Rcode, dns.TypeToString[got], scope, negSOA, tc.rcode, dns.TypeToString[tc.answer], tc.scope, r)
		}
	}
	if a := ask(t, addr, "ns.dns.vpn.example.test", dns.TypeA, ""); len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "127.0.0.1" {
		t.Fatalf("name server address %v, want the bound address", a.Answer)
	}
}
