package ogs

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// rttProber answers each address after a fixed RTT (missing: refused).
type rttProber map[string]time.Duration

func (p rttProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	if d, ok := p[addr]; ok {
		return d, nil
	}
	return 0, &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "connection refused"}}
}

// Two gateways on one IP give one A record; SRV keeps both ports.
func TestAnswerDedupesAddresses(t *testing.T) {
	o := newPluginWith(t, "gateway gw1b 192.0.2.1:2", rttProber{"192.0.2.1:1": 3 * time.Millisecond, "192.0.2.1:2": 2 * time.Millisecond, "192.0.2.2:1": 1 * time.Millisecond})
	r := query(t, o, "vpn.example.test.", dns.TypeA, "")
	var ips []string
	for _, rr := range r.Answer {
		ips = append(ips, rr.(*dns.A).A.String())
	}
	if !slices.Equal(ips, []string{"192.0.2.2", "192.0.2.1"}) {
		t.Fatalf("A %v, want each IP once, in order", ips)
	}
	if r := query(t, o, "vpn.example.test.", dns.TypeSRV, ""); len(r.Answer) != 4 {
		t.Fatalf("SRV %v, want the two ports of 192.0.2.1 kept", r.Answer)
	}
}

// The TXT layout: RTTs with one decimal, a failing gateway's reason.
func TestResultsTXT(t *testing.T) {
	o := newPluginWith(t, "", rttProber{"192.0.2.1:1": 12340 * time.Microsecond, "192.0.2.2:1": 12850 * time.Microsecond})
	before := time.Now().Truncate(time.Second)
	query(t, o, "vpn.example.test.", dns.TypeA, "")
	txt := query(t, o, "_ogs.vpn.example.test.", dns.TypeTXT, "").Answer[0].(*dns.TXT).Txt
	want := []string{
		"OGS Selection Results",
		"location src:10.240.0.0/24",
		"Last server: 'gw1'.",
		"Results obtained from OGS cache. No ping tests were performed.",
		"gw1 192.0.2.1:1 RTT(ms) 12.3",
		"gw2 192.0.2.2:1 RTT(ms) 12.8",
		"gw6 [2001:db8::6]:1 RTT(ms) - error other",
		"Selected 'gw1' as the optimal server.",
		"First choice 'gw1' held until TIME.", // the default hold, 4 h from the first answer
	}
	if n := len(want) - 1; len(txt) == len(want) {
		at, err := time.Parse(time.RFC3339, strings.TrimSuffix(strings.TrimPrefix(txt[n], "First choice 'gw1' held until "), "."))
		if err == nil && !at.Before(before.Add(4*time.Hour)) && !at.After(time.Now().Add(4*time.Hour)) {
			txt[n] = want[n]
		}
	}
	if !slices.Equal(txt, want) {
		t.Fatalf("TXT\n%q\nwant\n%q", txt, want)
	}
}

// Negative answers carry the SOA; SOA and NS answer at the apex, the name
// server's address below it; ECS scope is 0 unless the answer depends on
// the location.
func TestSOANSAndECSScope(t *testing.T) {
	o := newPluginWith(t, "", rttProber{"192.0.2.1:1": time.Millisecond})
	scope := func(r *dns.Msg) int {
		if opt := r.IsEdns0(); opt != nil {
			for _, e := range opt.Option {
				if s, ok := e.(*dns.EDNS0_SUBNET); ok {
					return int(s.SourceScope)
				}
			}
		}
		return -1
	}
	for _, tc := range []struct {
		name      string
		qtype     uint16
		rcode     int
		answers   int
		soaInAuth bool
		scope     int
	}{
		{"vpn.example.test.", dns.TypeA, dns.RcodeSuccess, 2, false, 24},
		{"vpn.example.test.", dns.TypeAAAA, dns.RcodeSuccess, 1, false, 24},
		{"_ogs.vpn.example.test.", dns.TypeTXT, dns.RcodeSuccess, 1, false, 24},
		{"vpn.example.test.", dns.TypeSOA, dns.RcodeSuccess, 1, false, 0},
		{"vpn.example.test.", dns.TypeNS, dns.RcodeSuccess, 1, false, 0},
		{"vpn.example.test.", dns.TypeMX, dns.RcodeSuccess, 0, true, 0},
		{"_ogs.vpn.example.test.", dns.TypeA, dns.RcodeSuccess, 0, true, 0},
		{"nope.vpn.example.test.", dns.TypeA, dns.RcodeNameError, 0, true, 0},
		{"ns.dns.vpn.example.test.", dns.TypeA, dns.RcodeSuccess, 1, false, 0},
		{"ns.dns.vpn.example.test.", dns.TypeAAAA, dns.RcodeSuccess, 0, true, 0},
	} {
		r := query(t, o, tc.name, tc.qtype, "10.9.9.0/24")
		soa := len(r.Ns) == 1 && r.Ns[0].Header().Rrtype == dns.TypeSOA
		if r.Rcode != tc.rcode || len(r.Answer) != tc.answers || soa != tc.soaInAuth || scope(r) != tc.scope || !r.Authoritative {
			t.Errorf("%s %s: rcode %d, %d answers, SOA in authority %v, ECS scope %d; want %d, %d, %v, %d:\n%v",
				tc.name, dns.TypeToString[tc.qtype], r.Rcode, len(r.Answer), soa, scope(r), tc.rcode, tc.answers, tc.soaInAuth, tc.scope, r)
		}
	}
	r := query(t, o, "vpn.example.test.", dns.TypeSOA, "")
	soa := r.Answer[0].(*dns.SOA)
	if soa.Ns != "ns.dns.vpn.example.test." || soa.Mbox != "hostmaster.vpn.example.test." || soa.Minttl != 30 || soa.Hdr.Ttl != 30 {
		t.Fatalf("default SOA %v", soa)
	}
	r = query(t, o, "vpn.example.test.", dns.TypeNS, "")
	if len(r.Extra) != 1 || r.Extra[0].(*dns.A).A.String() != "127.0.0.1" { // test.ResponseWriter's local address
		t.Fatalf("NS glue %v", r.Extra)
	}

	o = newPluginWith(t, "soa ns1.example.net. dns.example.net. 60\n\t\tns ns1.example.net.\n\t\tns a.ns.vpn.example.test 192.0.2.53", nil)
	r = query(t, o, "x.vpn.example.test.", dns.TypeA, "")
	if soa := r.Ns[0].(*dns.SOA); soa.Ns != "ns1.example.net." || soa.Mbox != "dns.example.net." || soa.Minttl != 60 {
		t.Fatalf("configured SOA %v", soa)
	}
	r = query(t, o, "vpn.example.test.", dns.TypeNS, "")
	if len(r.Answer) != 2 || len(r.Extra) != 1 || !strings.Contains(r.Extra[0].String(), "192.0.2.53") {
		t.Fatalf("configured NS %v / %v", r.Answer, r.Extra)
	}
}

// silentProber answers its addresses after their RTT and never answers the
// others: their probes end with the context (a gateway dropping SYNs).
type silentProber map[string]time.Duration

func (p silentProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	if d, ok := p[addr]; ok {
		return d, nil
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

// A run still going at the answer deadline: the answer carries the
// gateways heard from so far, with the short fallback TTL, and the TXT says
// so; once the run is over the measured order carries the full TTL.
func TestAnswerDeadlineShortTTL(t *testing.T) {
	o := newPluginWith(t, "answer_deadline 50ms\n probe_timeout 1s\n deadline 2s\n ttl 60\n fallback_ttl 3", silentProber{"192.0.2.2:1": time.Millisecond})
	r := query(t, o, "vpn.example.test.", dns.TypeA, "")
	if len(r.Answer) != 2 || r.Answer[0].(*dns.A).A.String() != "192.0.2.2" || r.Answer[0].Header().Ttl != 3 {
		t.Fatalf("at the answer deadline: %v, want gw2 first with TTL 3", r.Answer)
	}
	txt := strings.Join(query(t, o, "_ogs.vpn.example.test.", dns.TypeTXT, "").Answer[0].(*dns.TXT).Txt, "\n")
	if !strings.Contains(txt, "OGS ping tests still running at the 50ms answer deadline; gateways answered so far used.") || !strings.Contains(txt, "gw1 192.0.2.1:1 RTT(ms) -") {
		t.Fatalf("TXT:\n%s", txt)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r = query(t, o, "vpn.example.test.", dns.TypeA, "")
		if r.Answer[0].Header().Ttl == 60 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished run never answered with the full TTL: %v", r.Answer)
		}
	}
	if r.Answer[0].(*dns.A).A.String() != "192.0.2.2" {
		t.Fatalf("measured order %v", r.Answer)
	}
}
