package ogs

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/gatewaysel"
)

// answer gives the gateways' records in the selected order. Two gateways on
// one IP (different ports) give one A or AAAA record, at the first one's
// place; SRV keeps both (the port differs). records bounds the records.
func (o *OGS) answer(qname string, qtype uint16, res *gatewayorder.Result, ttl uint32) []dns.RR {
	var out []dns.RR
	for pos, g := range gatewayorder.Targets(res) {
		if o.records > 0 && len(out) >= o.records {
			break
		}
		ip := g.IP
		hdr := dns.RR_Header{Name: qname, Class: dns.ClassINET, Ttl: ttl, Rrtype: qtype}
		switch {
		case qtype == dns.TypeA && ip.To4() != nil && !answered(out, ip):
			out = append(out, &dns.A{Hdr: hdr, A: ip.To4()})
		case qtype == dns.TypeAAAA && ip.To4() == nil && !answered(out, ip):
			out = append(out, &dns.AAAA{Hdr: hdr, AAAA: ip})
		case qtype == dns.TypeSRV:
			_, port, _ := net.SplitHostPort(g.Addr)
			p, _ := strconv.Atoi(port)
			out = append(out, &dns.SRV{Hdr: hdr, Priority: uint16(pos), Weight: 0, Port: uint16(p), Target: dns.Fqdn(g.Name)})
		}
	}
	return out
}

// answered reports whether rrs already hold an address record for ip; a
// scan, as answers hold a handful of records.
func answered(rrs []dns.RR, ip net.IP) bool {
	for _, rr := range rrs {
		switch a := rr.(type) {
		case *dns.A:
			if a.A.Equal(ip) {
				return true
			}
		case *dns.AAAA:
			if a.AAAA.Equal(ip) {
				return true
			}
		}
	}
	return false
}

// soaConfig is the `soa` option; empty names take the per-zone defaults.
type soaConfig struct {
	mname, rname string
	minimum      uint32 // also the SOA record's TTL: the negative-caching TTL
	serial       uint32
}

// nsConfig is one `ns` option: a name server and, for a name inside the
// zone, its addresses (none: the address the query arrived on).
type nsConfig struct {
	name  string
	addrs []net.IP
}

// nameServers returns zone's name servers: those configured, or
// ns.dns.ZONE.
func (o *OGS) nameServers(zone string) []nsConfig {
	if len(o.ns) > 0 {
		return o.ns
	}
	return []nsConfig{{name: "ns.dns." + zone}}
}

func (o *OGS) soaRecord(zone string) dns.RR {
	mname, rname := o.soa.mname, o.soa.rname
	if mname == "" {
		mname = o.nameServers(zone)[0].name
	}
	if rname == "" {
		rname = "hostmaster." + zone
	}
	return &dns.SOA{
		Hdr:  dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: o.soa.minimum},
		Ns:   mname,
		Mbox: rname, Serial: o.soa.serial,
		Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: o.soa.minimum,
	}
}

func (o *OGS) nsRecords(zone string) []dns.RR {
	var out []dns.RR
	for _, ns := range o.nameServers(zone) {
		out = append(out, &dns.NS{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: o.ttl}, Ns: ns.name})
	}
	return out
}

// isNSName reports whether qname is one of zone's name servers inside it.
func (o *OGS) isNSName(zone, qname string) bool {
	for _, ns := range o.nameServers(zone) {
		if ns.name == qname && dns.IsSubDomain(zone, qname) {
			return true
		}
	}
	return false
}

// glue returns the address records of zone's name servers inside the zone,
// of the types asked, optionally only for the name only.
func (o *OGS) glue(zone string, state request.Request, only string, types ...uint16) []dns.RR {
	var out []dns.RR
	for _, ns := range o.nameServers(zone) {
		if !dns.IsSubDomain(zone, ns.name) || (only != "" && ns.name != only) {
			continue
		}
		addrs := ns.addrs
		if len(addrs) == 0 {
			if ip := net.ParseIP(state.LocalIP()); ip != nil {
				addrs = []net.IP{ip}
			}
		}
		for _, ip := range addrs {
			hdr := dns.RR_Header{Name: ns.name, Class: dns.ClassINET, Ttl: o.ttl}
			for _, t := range types {
				switch {
				case t == dns.TypeA && ip.To4() != nil:
					hdr.Rrtype = t
					out = append(out, &dns.A{Hdr: hdr, A: ip.To4()})
				case t == dns.TypeAAAA && ip.To4() == nil:
					hdr.Rrtype = t
					out = append(out, &dns.AAAA{Hdr: hdr, AAAA: ip})
				}
			}
		}
	}
	return out
}

// results renders a location's "OGS Selection Results" as one TXT record;
// the layout is in the README (Diagnostics).
func (o *OGS) results(qname, loc string, sel gatewaysel.Selection) dns.RR {
	gws := sel.Gateways
	txt := []string{"OGS Selection Results", "location " + loc, lastServer(sel.LastServer), happened(sel, o.cfg.Wait())}
	reasons := sel.Reasons
	if sel.Failed != nil {
		reasons = sel.Failed.Reasons
	}
	listed := make([]bool, len(gws))
	line := func(i int, omitted bool) string {
		listed[i] = true
		rtt := "-"
		if sel.RTTs[i] > 0 {
			rtt = strconv.FormatFloat(float64(sel.RTTs[i])/float64(time.Millisecond), 'f', 1, 64)
		}
		l := fmt.Sprintf("%s %s RTT(ms) %s", gws[i].Name, gws[i].Addr, rtt)
		if reasons != nil && reasons[i] != "" {
			l += " error " + reasons[i]
		}
		if sel.Dead != nil && sel.Dead[i] != "" {
			l += " re-check failed " + sel.Dead[i]
		}
		if omitted {
			l += " omitted"
		}
		return l
	}
	for _, i := range sel.Order {
		txt = append(txt, line(i, false))
	}
	for i := range gws {
		if !listed[i] {
			txt = append(txt, line(i, true))
		}
	}
	if len(sel.Order) > 0 {
		first := gws[sel.Order[0]]
		for _, u := range first.Unprobed {
			txt = append(txt, fmt.Sprintf("%s %s backup of %s, not probed", u.Name, u.Addr, first.Name))
		}
	}
	if sel.Source == gatewaysel.Configured {
		txt = append(txt, "No optimal server: configured order.")
	} else if len(sel.Order) > 0 {
		txt = append(txt, fmt.Sprintf("Selected '%s' as the optimal server.", gws[sel.Order[0]].Name))
	}
	if !sel.HoldUntil.IsZero() && len(sel.Order) > 0 {
		txt = append(txt, fmt.Sprintf("First choice '%s' held until %s.", gws[sel.Order[0]].Name, sel.HoldUntil.UTC().Format(time.RFC3339)))
	}
	return &dns.TXT{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 0}, Txt: txt}
}

// lastServer is the seed's "Last server" line: the location's previous
// answer's first choice.
func lastServer(name string) string {
	if name == "" {
		return "Last server: none."
	}
	return "Last server: '" + name + "'."
}

// happened says in one line where the selection came from.
func happened(sel gatewaysel.Selection, deadline time.Duration) string {
	switch sel.Source {
	case gatewaysel.Cached:
		return "Results obtained from OGS cache. No ping tests were performed."
	case gatewaysel.FromReplica:
		return "Results obtained from the shared OGS cache (another replica's ping tests). No ping tests were performed."
	case gatewaysel.Probed:
		return "OGS ping tests performed."
	case gatewaysel.Reported:
		return fmt.Sprintf("Results obtained from client reports (source reports): %d reporters. No ping tests were performed.", sel.Reporters)
	}
	var what string
	switch sel.Why {
	case gatewaysel.WhyDeadline:
		what = fmt.Sprintf("OGS ping tests still running at the %v answer deadline", deadline)
	case gatewaysel.WhyNoAnswer:
		what = "OGS ping tests performed: no gateway answered"
	case gatewaysel.WhyRetryWait:
		what = "No gateway answered the last OGS ping tests"
		if sel.Failed != nil {
			what += " (" + sel.Failed.At.UTC().Format(time.RFC3339) + ")"
		}
		what += "; next tests from " + sel.RetryAt.UTC().Format(time.RFC3339)
	default:
		what = "Shutting down"
	}
	if sel.Source == gatewaysel.Partial {
		return what + "; gateways answered so far used."
	}
	if sel.Source == gatewaysel.Previous {
		return what + "; previous selection (" + sel.At.UTC().Format(time.RFC3339) + ") used."
	}
	return what + "; no previous selection, configured order used."
}

// logRun logs a probe run, one line per gateway with its probes' RTTs (and a
// failing gateway's last error) and then the gateway selected, and records
// its metrics.
func (o *OGS) logRun(run gatewaysel.Run) {
	gws := run.Gateways
	for i, rs := range run.RTTs {
		var ms []string
		for j, r := range rs {
			if r > 0 {
				ms = append(ms, strconv.FormatInt(r.Milliseconds(), 10))
				probes.WithLabelValues(gws[i].Name, "ok").Inc()
				probeRTT.WithLabelValues(gws[i].Name).Observe(r.Seconds())
			} else {
				ms = append(ms, "-")
				probes.WithLabelValues(gws[i].Name, "failed").Inc()
				probeFailures.WithLabelValues(gws[i].Name, run.Reasons[i][j]).Inc()
			}
		}
		line := fmt.Sprintf("OGS ping results for %s (location %s): (%s)", gws[i].Name, run.Location, strings.Join(ms, " "))
		if err := run.Errors[i]; err != nil {
			line += fmt.Sprintf(" last error: %s: %v", gatewaysel.Reason(err), err)
		}
		log.Info(line)
	}
	runs.Inc()
	switch {
	case run.Result != nil:
		log.Infof("Selected '%s' as the optimal server for location %s. %s", run.Result.Gateways[run.Result.Order[0]].Name, run.Location, lastServer(run.LastServer))
	case run.Previous != nil:
		log.Warningf("no gateway answered for location %s: answering with its previous selection (from %s, '%s' first); no new probe run before %s",
			run.Location, run.Previous.At.UTC().Format(time.RFC3339), run.Previous.Gateways[run.Previous.Order[0]].Name, run.RetryAt.UTC().Format(time.RFC3339))
	default:
		log.Warningf("no gateway answered for location %s, which has no previous selection: answering in configured order; no new probe run before %s",
			run.Location, run.RetryAt.UTC().Format(time.RFC3339))
	}
}

// logRecheck logs a re-check that changed a gateway's state, and counts all.
func (o *OGS) logRecheck(c gatewaysel.Recheck) {
	if c.Err != nil {
		rechecks.WithLabelValues(c.Gateway.Name, "failed").Inc()
		probeFailures.WithLabelValues(c.Gateway.Name, c.Reason).Inc()
	} else {
		rechecks.WithLabelValues(c.Gateway.Name, "ok").Inc()
	}
	switch {
	case c.Changed && c.Err != nil:
		log.Warningf("re-check: %s, a cached first choice, failed (%s: %v): answers move it behind the gateways not found dead", c.Gateway.Name, c.Reason, c.Err)
	case c.Changed:
		log.Infof("re-check: %s answers again (%d ms): cached selections put it back in place", c.Gateway.Name, c.RTT.Milliseconds())
	}
}
