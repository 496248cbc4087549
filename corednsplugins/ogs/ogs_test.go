package ogs

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/latency"
)

func newPlugin(t *testing.T, extra string) *OGS { return newPluginWith(t, extra, nil) }

// newPluginWith parses the test block plus extra and starts it, probing
// with prober when not nil.
func newPluginWith(t *testing.T, extra string, prober latency.Prober) *OGS {
	t.Helper()
	// An option may be given once: extra's own deadline replaces the 200ms.
	deadline := "deadline 200ms"
	for _, l := range strings.Split(extra, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "deadline" {
			deadline = ""
		}
	}
	c := caddy.NewTestController("dns", `ogs vpn.example.test {
		gateway gw1 192.0.2.1:1
		gateway gw2 192.0.2.2:1
		gateway gw6 [2001:db8::6]:1
		probe tcp
		`+deadline+`
		srv
		`+extra+`
	}`)
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	o.state = t.Name() + extra
	if prober != nil {
		o.cfg.Prober = prober
	}
	if err := o.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.stop() })
	o.Next = test.NextHandler(dns.RcodeSuccess, nil)
	return o
}

func query(t *testing.T, o *OGS, name string, qtype uint16, ecs string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if ecs != "" {
		_, n, _ := net.ParseCIDR(ecs)
		ones, _ := n.Mask.Size()
		m.SetEdns0(4096, false)
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: uint8(ones), Address: n.IP})
	}
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	if _, err := o.ServeDNS(context.Background(), rec, m); err != nil {
		t.Fatal(err)
	}
	return rec.Msg
}

// Nothing answers probes here (192.0.2.0/24 is not routed, the deadline
// is short): answers come in configured order, by record type.
func TestAnswersByType(t *testing.T) {
	o := newPlugin(t, "")
	if r := query(t, o, "vpn.example.test.", dns.TypeA, ""); len(r.Answer) != 2 || r.Answer[0].(*dns.A).A.String() != "192.0.2.1" || !r.Authoritative {
		t.Fatalf("A: %v", r.Answer)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeAAAA, ""); len(r.Answer) != 1 || r.Answer[0].(*dns.AAAA).AAAA.String() != "2001:db8::6" {
		t.Fatalf("AAAA: %v", r.Answer)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeSRV, ""); len(r.Answer) != 3 || r.Answer[2].(*dns.SRV).Target != "gw6." || r.Answer[2].(*dns.SRV).Priority != 2 {
		t.Fatalf("SRV: %v", r.Answer)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeMX, ""); len(r.Answer) != 0 || r.Rcode != dns.RcodeSuccess || len(r.Ns) != 1 {
		t.Fatalf("MX: %v", r)
	}
	txt := query(t, o, "_ogs.vpn.example.test.", dns.TypeTXT, "").Answer[0].(*dns.TXT).Txt
	if txt[0] != "OGS Selection Results" || txt[len(txt)-1] != "No optimal server: configured order." {
		t.Fatalf("TXT %q", txt)
	}
}

func TestNamesBelowAndOutside(t *testing.T) {
	o := newPlugin(t, "")
	if r := query(t, o, "x.vpn.example.test.", dns.TypeA, ""); r.Rcode != dns.RcodeNameError {
		t.Fatalf("below a served name: rcode %d, want NXDOMAIN", r.Rcode)
	}
	// Outside, and below with fallthrough: the next plugin (which here
	// answers REFUSED and writes nothing) is called.
	o.Next = test.NextHandler(dns.RcodeRefused, nil)
	if r := query(t, o, "other.test.", dns.TypeA, ""); r != nil {
		t.Fatalf("outside: ogs answered %v", r)
	}
	o = newPlugin(t, "fallthrough")
	o.Next = test.NextHandler(dns.RcodeRefused, nil)
	if r := query(t, o, "x.vpn.example.test.", dns.TypeA, ""); r != nil {
		t.Fatalf("with fallthrough: ogs answered %v", r)
	}
}

func TestLocationFromECSAndSource(t *testing.T) {
	o := newPlugin(t, "prefix 16 48")
	m := new(dns.Msg)
	m.SetQuestion("vpn.example.test.", dns.TypeA)
	m.SetEdns0(4096, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.ParseIP("10.1.2.3").To4()})
	loc, ecs := o.location(requestFor(m))
	if loc != "ecs:10.1.2.0/24" || ecs == nil {
		t.Fatalf("ECS location %q", loc)
	}
	m.IsEdns0().Option = nil
	if loc, _ := o.location(requestFor(m)); loc != "src:10.240.0.0/16" { // test.ResponseWriter's client is 10.240.0.1
		t.Fatalf("source location %q", loc)
	}
	r := query(t, o, "vpn.example.test.", dns.TypeA, "10.9.9.0/24")
	if opt := r.IsEdns0(); opt == nil || len(opt.Option) != 1 || opt.Option[0].(*dns.EDNS0_SUBNET).SourceScope != 24 {
		t.Fatalf("ECS not echoed with its scope: %v", r)
	}
}

func requestFor(m *dns.Msg) request.Request {
	return request.Request{W: &test.ResponseWriter{}, Req: m}
}
