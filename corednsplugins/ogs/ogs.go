// Package ogs is the CoreDNS plugin ogs: it answers A, AAAA (and SRV) queries
// for its names with gateways ordered by probed round-trip time, per client
// location, the way Cisco AnyConnect's Optimal Gateway Selection orders its
// headends. The selection itself lives in internal/gatewaysel (probe runs,
// cache, cluster claim), internal/gatewayorder (the order rule) and
// internal/rttreports (client reports).
package ogs

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// OGS is the plugin handler.
type OGS struct {
	Next plugin.Handler
	Fall fall.F

	names       []string // served names, FQDN, lower case: each a zone apex
	diagnostic  string   // TXT name of the selection results
	ttl         uint32
	fallbackTTL uint32 // answers without a finished run's result; never above ttl
	records     int    // 0: all
	srv         bool
	v4Prefix    int
	v6Prefix    int
	hasV4       bool // some gateway has an IPv4 address
	hasV6       bool
	soa         soaConfig
	ns          []nsConfig             // empty: ns.dns.ZONE at the local address
	resolv      *gatewaysel.ResolvConf // location from resolver config, when set
	networks    *gatewaysel.Networks
	lastWarn    atomic.Int64 // unix ns of the last resolver-config warning

	// Process state, adopted across reloads (setup.go).
	cfg    gatewaysel.Config // this configuration's selector settings
	state  string            // the name the state is kept under
	lease  *gatewaysel.Lease
	sel    *gatewaysel.Table
	mark   uint64 // states.Mark() when a reload began
	marked bool

	// The shared cache level and the admin view (store.go, admin.go).
	redis     *redisconn.Config // store redis; nil: none
	storeName string            // the Redis key namespace's name
	store     *redisStore
	admin     string // admin HOST:PORT; "": none
	adminOn   bool

	reports *reportConfig // the report endpoint (reports.go); nil: off
}

// Name implements plugin.Handler.
func (o *OGS) Name() string { return pluginName }

// ServeDNS implements plugin.Handler. Only A, AAAA and SRV at a served name,
// and TXT at the diagnostic name, depend on the client's location: they
// alone run the selection, and they alone echo ECS with a non-zero scope.
func (o *OGS) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	qname, qtype := strings.ToLower(state.Name()), state.QType()
	zone := o.zoneOf(qname)
	diag := qname == o.diagnostic
	if zone == "" && !diag {
		return plugin.NextOrFailure(o.Name(), o.Next, ctx, w, r)
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	scoped := false // the answer depends on the location
	switch {
	case diag && qtype == dns.TypeTXT:
		loc, ecs := o.location(state)
		m.Answer = []dns.RR{o.results(qname, loc, o.selectFor(ctx, loc, o.reportKey(state, ecs)))}
		scoped = true
	case qname == zone && o.selects(qtype):
		loc, ecs := o.location(state)
		sel := o.selectFor(ctx, loc, o.reportKey(state, ecs))
		m.Answer = o.answer(qname, qtype, sel.Result, o.ttlOf(sel))
		scoped = true
	case qname == zone && qtype == dns.TypeSOA:
		m.Answer = []dns.RR{o.soaRecord(zone)}
	case qname == zone && qtype == dns.TypeNS:
		m.Answer = o.nsRecords(zone)
		m.Extra = o.glue(zone, state, "", dns.TypeA, dns.TypeAAAA)
	case o.isNSName(zone, qname):
		m.Answer = o.glue(zone, state, qname, qtype)
	case qname == zone || diag:
		// NODATA: the name exists, not with this type.
	case o.Fall.Through(qname):
		return plugin.NextOrFailure(o.Name(), o.Next, ctx, w, r)
	default:
		m.Rcode = dns.RcodeNameError
	}
	if len(m.Answer) == 0 && zone != "" {
		// RFC 2308: negative answers carry the zone's SOA, so resolvers can
		// cache them.
		m.Ns = []dns.RR{o.soaRecord(zone)}
	}
	o.echoECS(state, m, scoped)
	w.WriteMsg(m)
	return m.Rcode, nil
}

// selectFor runs the selection for loc (from its clients' reports under
// reportKey, when there are enough) and counts it.
func (o *OGS) selectFor(ctx context.Context, loc, reportKey string) gatewaysel.Selection {
	sel := o.sel.SelectReported(ctx, loc, reportKey)
	server := metrics.WithServer(ctx)
	switch sel.Source {
	case gatewaysel.Reported:
		reportAnswers.WithLabelValues(server).Inc()
	case gatewaysel.Cached:
		cacheHits.WithLabelValues(server).Inc()
		storeHits.WithLabelValues("local").Inc()
		if sel.FirstHit { // once per result, not per query
			log.Infof("OGS was already performed, previous selection will be used (location %s, '%s' first).", loc, sel.Gateways[sel.Order[0]].Name)
		}
	case gatewaysel.FromReplica:
		cacheHits.WithLabelValues(server).Inc()
		storeHits.WithLabelValues("redis").Inc()
	default:
		cacheMisses.WithLabelValues(server).Inc()
	}
	if !sel.Source.Fresh() {
		fallbacks.WithLabelValues(server, sel.Source.String(), sel.Why.String()).Inc()
	}
	return sel
}

// ttlOf is the TTL of answers of sel: a stand-in for a result still
// being measured (or that could not be) is kept short, so that resolvers
// ask again soon and get the measured order; and no answer outlives the
// hold on its first choice (rounded up to a second), so resolvers drop the
// held order when the hold ends.
func (o *OGS) ttlOf(sel gatewaysel.Selection) uint32 {
	ttl := o.ttl
	if !sel.Source.Fresh() {
		ttl = min(o.fallbackTTL, o.ttl)
	}
	if !sel.HoldUntil.IsZero() {
		left := (time.Until(sel.HoldUntil) + time.Second - 1) / time.Second
		ttl = uint32(max(1, min(int64(ttl), int64(left))))
	}
	return ttl
}

// selects reports whether a query of qtype at a served name is answered
// from the selection: only types some gateway can answer, so a query that
// could only get NODATA never starts a probe run.
func (o *OGS) selects(qtype uint16) bool {
	switch qtype {
	case dns.TypeA:
		return o.hasV4
	case dns.TypeAAAA:
		return o.hasV6
	case dns.TypeSRV:
		return o.srv
	}
	return false
}

// zoneOf returns the served name qname is at or below, "" if none.
func (o *OGS) zoneOf(qname string) string {
	for _, n := range o.names {
		if dns.IsSubDomain(n, qname) {
			return n
		}
	}
	return ""
}

// echoECS echoes the query's EDNS Client Subnet option (RFC 7871 §7.2.1):
// with the source prefix as scope when the answer depends on the location,
// else with scope 0.
func (o *OGS) echoECS(state request.Request, m *dns.Msg, scoped bool) {
	ecs := clientSubnet(state.Req)
	if ecs == nil {
		return
	}
	reply := *ecs
	reply.SourceScope = 0
	if scoped {
		reply.SourceScope = ecs.SourceNetmask
	}
	if m.IsEdns0() == nil {
		m.SetEdns0(uint16(state.Size()), state.Do())
	}
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &reply)
}

func clientSubnet(r *dns.Msg) *dns.EDNS0_SUBNET {
	if opt := r.IsEdns0(); opt != nil {
		for _, e := range opt.Option {
			if s, ok := e.(*dns.EDNS0_SUBNET); ok && s.Address != nil {
				return s
			}
		}
	}
	return nil
}

// location names the client's network: the ECS subnet when the query
// carries one; else, with location resolv_conf, the network named by the
// resolver configuration's "suffix|server" pairs (for CoreDNS running as
// the client's own resolver); else the source address masked to the
// configured prefix.
func (o *OGS) location(state request.Request) (string, *dns.EDNS0_SUBNET) {
	if s := clientSubnet(state.Req); s != nil {
		bits := 32
		if s.Family == 2 {
			bits = 128
		}
		return "ecs:" + maskedPrefix(s.Address, int(s.SourceNetmask), bits), s
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
	return "src:" + maskedNet(ip, o.v4Prefix, o.v6Prefix), nil
}

// maskedNet is ip's network of v4Len or v6Len bits ("a.b.c.0/24"): the key
// of a location, a report's network and a reporter's source ("": no ip).
func maskedNet(ip net.IP, v4Len, v6Len int) string {
	if ip == nil {
		return ""
	}
	if v4 := ip.To4(); v4 != nil {
		return maskedPrefix(v4, v4Len, 32)
	}
	return maskedPrefix(ip, v6Len, 128)
}

// maskedPrefix is ip's network of its first ones bits of bits
// ("a.b.c.0/24").
func maskedPrefix(ip net.IP, ones, bits int) string {
	m := net.CIDRMask(ones, bits)
	return (&net.IPNet{IP: ip.Mask(m), Mask: m}).String()
}
