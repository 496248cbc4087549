// Package ogs is the CoreDNS plugin ogs: it answers A, AAAA (and SRV) queries
// for its names with gateways ordered by probed round-trip time, per client
// location, the way Cisco AnyConnect's Optimal Gateway Selection orders its
// headends. The selection itself lives in internal/ogs.
package ogs

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/ogs"
)

// OGS is the plugin handler.
type OGS struct {
	Next plugin.Handler
	Fall fall.F

	names      []string // served names, FQDN, lower case
	diagnostic string   // TXT name of the selection results
	ttl        uint32
	records    int // 0: all
	srv        bool
	v4Prefix   int
	v6Prefix   int
	resolv     *ogs.ResolvConf // location from resolver config, when set
	networks   *ogs.Networks
	lastWarn   atomic.Int64 // unix ns of the last resolver-config warning

	// Process state, adopted across reloads (setup.go).
	cfg    ogs.Config // this configuration's selector settings
	state  string     // the name the state is kept under
	lease  *ogs.Lease
	sel    *ogs.Selector
	mark   uint64 // states.Mark() when a reload began
	marked bool
}

// Name implements plugin.Handler.
func (o *OGS) Name() string { return pluginName }

// ServeDNS implements plugin.Handler.
func (o *OGS) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	qname := strings.ToLower(state.Name())
	diag := qname == o.diagnostic
	if !diag && !o.serves(qname) {
		// Below a served name we are authoritative: NXDOMAIN, unless
		// fallthrough covers it. Anything else is not ours.
		if o.below(qname) && !o.Fall.Through(qname) {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeNameError)
			m.Authoritative = true
			w.WriteMsg(m)
			return dns.RcodeNameError, nil
		}
		return plugin.NextOrFailure(o.Name(), o.Next, ctx, w, r)
	}
	loc, ecs := o.location(state)
	res, src := o.sel.Select(ctx, loc)
	server := metrics.WithServer(ctx)
	if src == ogs.Cached {
		cacheHits.WithLabelValues(server).Inc()
	} else {
		cacheMisses.WithLabelValues(server).Inc()
	}
	if src == ogs.Previous || src == ogs.Configured {
		fallbacks.WithLabelValues(server, src.String()).Inc()
	}

	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	switch {
	case diag && state.QType() == dns.TypeTXT:
		m.Answer = []dns.RR{o.results(qname, loc, res, src)}
	case diag:
	default:
		m.Answer = o.answer(qname, state.QType(), res)
	}
	if ecs != nil {
		if opt := m.IsEdns0(); opt == nil {
			m.SetEdns0(uint16(state.Size()), state.Do())
		}
		ecs.SourceScope = ecs.SourceNetmask
		m.IsEdns0().Option = append(m.IsEdns0().Option, ecs)
	}
	w.WriteMsg(m)
	return dns.RcodeSuccess, nil
}

func (o *OGS) serves(qname string) bool {
	for _, n := range o.names {
		if qname == n {
			return true
		}
	}
	return false
}

func (o *OGS) below(qname string) bool {
	for _, n := range o.names {
		if dns.IsSubDomain(n, qname) {
			return true
		}
	}
	return false
}

// location names the client's network: the ECS subnet when the query
// carries one; else, with location resolv_conf, the network named by the
// resolver configuration's "suffix|server" pairs (for CoreDNS running as
// the client's own resolver); else the source address masked to the
// configured prefix.
func (o *OGS) location(state request.Request) (string, *dns.EDNS0_SUBNET) {
	if opt := state.Req.IsEdns0(); opt != nil {
		for _, e := range opt.Option {
			if s, ok := e.(*dns.EDNS0_SUBNET); ok && s.Address != nil {
				bits := 32
				if s.Family == 2 {
					bits = 128
				}
				prefix := net.IPNet{IP: s.Address.Mask(net.CIDRMask(int(s.SourceNetmask), bits)), Mask: net.CIDRMask(int(s.SourceNetmask), bits)}
				reply := *s
				return "ecs:" + prefix.String(), &reply
			}
		}
	}
	if o.resolv != nil {
		keys, err := o.resolv.Keys(time.Now())
		if err == nil && len(keys) > 0 {
			return "net:" + o.networks.Location(keys), nil
		}
		if last := o.lastWarn.Load(); time.Since(time.Unix(0, last)) > time.Minute && o.lastWarn.CompareAndSwap(last, time.Now().UnixNano()) {
			log.Warningf("location from %s: %v (falling back to the source address)", o.resolv.Path, err)
		}
	}
	ip := net.ParseIP(state.IP())
	if ip == nil {
		return "unknown", nil
	}
	if v4 := ip.To4(); v4 != nil {
		return "src:" + (&net.IPNet{IP: v4.Mask(net.CIDRMask(o.v4Prefix, 32)), Mask: net.CIDRMask(o.v4Prefix, 32)}).String(), nil
	}
	return "src:" + (&net.IPNet{IP: ip.Mask(net.CIDRMask(o.v6Prefix, 128)), Mask: net.CIDRMask(o.v6Prefix, 128)}).String(), nil
}

func (o *OGS) answer(qname string, qtype uint16, res *ogs.Result) []dns.RR {
	gws := res.Gateways
	var out []dns.RR
	for pos, i := range res.Order {
		if o.records > 0 && len(out) >= o.records {
			break
		}
		ip := gws[i].IP
		hdr := dns.RR_Header{Name: qname, Class: dns.ClassINET, Ttl: o.ttl}
		switch {
		case qtype == dns.TypeA && ip.To4() != nil:
			hdr.Rrtype = dns.TypeA
			out = append(out, &dns.A{Hdr: hdr, A: ip.To4()})
		case qtype == dns.TypeAAAA && ip.To4() == nil:
			hdr.Rrtype = dns.TypeAAAA
			out = append(out, &dns.AAAA{Hdr: hdr, AAAA: ip})
		case qtype == dns.TypeSRV && o.srv:
			_, port, _ := net.SplitHostPort(gws[i].Addr)
			p, _ := strconv.Atoi(port)
			hdr.Rrtype = dns.TypeSRV
			out = append(out, &dns.SRV{Hdr: hdr, Priority: uint16(pos), Weight: 0, Port: uint16(p), Target: dns.Fqdn(gws[i].Name)})
		}
	}
	return out
}

// results renders the seed's "OGS Selection Results" as one TXT record.
func (o *OGS) results(qname, loc string, res *ogs.Result, src ogs.Source) dns.RR {
	gws := res.Gateways
	txt := []string{"OGS Selection Results", "location " + loc}
	switch src {
	case ogs.Cached:
		txt = append(txt, "Results obtained from OGS cache. No ping tests were performed.")
	case ogs.Probed:
		txt = append(txt, "OGS ping tests performed.")
	default:
		txt = append(txt, "No OGS result within the deadline: "+src.String()+" selection used.")
	}
	for _, i := range res.Order {
		rtt := "-"
		if res.RTTs[i] > 0 {
			rtt = strconv.FormatInt(res.RTTs[i].Milliseconds(), 10)
		}
		txt = append(txt, fmt.Sprintf("%s %s RTT(ms) %s", gws[i].Name, gws[i].Addr, rtt))
	}
	if len(res.Order) > 0 {
		txt = append(txt, fmt.Sprintf("Selected '%s' as the optimal server.", gws[res.Order[0]].Name))
	}
	return &dns.TXT{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 0}, Txt: txt}
}

// logRun logs a probe run the way the seed's client does, then records its
// metrics.
func (o *OGS) logRun(run ogs.Run) {
	gws := run.Gateways
	for i, rs := range run.RTTs {
		var ms []string
		for _, r := range rs {
			if r > 0 {
				ms = append(ms, strconv.FormatInt(r.Milliseconds(), 10))
				probes.WithLabelValues(gws[i].Name, "ok").Inc()
				probeRTT.WithLabelValues(gws[i].Name).Observe(r.Seconds())
			} else {
				ms = append(ms, "-")
				probes.WithLabelValues(gws[i].Name, "failed").Inc()
			}
		}
		log.Infof("OGS ping results for %s (location %s): (%s)", gws[i].Name, run.Location, strings.Join(ms, " "))
	}
	runs.Inc()
	if run.Result != nil {
		log.Infof("Selected '%s' as the optimal server for location %s.", run.Result.Gateways[run.Result.Order[0]].Name, run.Location)
	} else {
		log.Warningf("no gateway answered for location %s: keeping its previous selection", run.Location)
	}
}
