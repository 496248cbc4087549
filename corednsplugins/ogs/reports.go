package ogs

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// Report endpoint defaults (README, "Reports").
const (
	defaultReportMaxBody = 16 << 10
	defaultReportRate    = 1.0 // reports per second, per token and per source network
	defaultReportBurst   = 10
	reportSources        = 100_000 // source networks whose rate is tracked, at most
	// A source network is the report's source address masked to these: an
	// IPv6 client holds a /64 (RFC 6177) and rotates addresses inside it at
	// will; an IPv4 client holds an address, and a /24 may be many clients
	// (a campus, a carrier's NAT pool) that one noisy host must not throttle.
	defaultReportV4Source = 32
	defaultReportV6Source = 64
)

// reportConfig is the endpoint's part of an ogs block.
type reportConfig struct {
	tokens   *Tokens
	listen   string // reports HOST:PORT; "": on the admin listener
	on       bool   // registered on listen
	v4Source int    // source network prefix lengths (report_source_prefix)
	v6Source int
	maxBody  int64
	rate     float64
	burst    int
	trusted  []*net.IPNet
	byToken  *ReportLimiter
	bySource *ReportLimiter
}

// reportKey is the network a client's reports and queries share: its
// address masked to the configured prefix, for an ECS subnet at least that
// long as for a source address. A shorter ECS subnet, or a location from
// the resolver configuration, has none (reports do not apply).
func (o *OGS) reportKey(state request.Request, ecs *dns.EDNS0_SUBNET) string {
	if o.reports == nil {
		return ""
	}
	if ecs != nil {
		bits := o.v4Prefix
		if ecs.Family == 2 {
			bits = o.v6Prefix
		}
		if int(ecs.SourceNetmask) < bits {
			return ""
		}
		return maskedNet(ecs.Address, o.v4Prefix, o.v6Prefix)
	}
	if o.resolv != nil {
		return ""
	}
	return maskedNet(net.ParseIP(state.IP()), o.v4Prefix, o.v6Prefix)
}

// reportAnswer is the endpoint's JSON answer.
type reportAnswer struct {
	Accepted  bool   `json:"accepted"`
	Location  string `json:"location,omitempty"`
	Reporter  string `json:"reporter,omitempty"`
	Reporters int    `json:"reporters,omitempty"`
	Source    string `json:"source,omitempty"` // what the location answers from now: reports or probed
	Error     string `json:"error,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

func writeReportAnswer(w http.ResponseWriter, status int, a reportAnswer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(a)
}

// refuse answers an error and counts it by reason.
func refuse(w http.ResponseWriter, status int, reason, detail string) {
	reportsTotal.WithLabelValues(reason).Inc()
	writeReportAnswer(w, status, reportAnswer{Error: reason, Detail: detail})
}

// serveReports is POST /ogs/reports on a reports listener, and on an admin
// listener for the blocks without one (a block with `reports` takes none on
// its admin listener).
func (l *adminListener) serveReports(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		refuse(w, http.StatusMethodNotAllowed, "method", "POST a report")
		return
	}
	admins.Lock()
	var cands []*OGS
	zone := strings.ToLower(strings.TrimSuffix(r.URL.Query().Get("zone"), ".")) + "."
	for _, bs := range l.blocks {
		b := bs[len(bs)-1]
		if b.reports == nil || b.sel == nil || (l.kind == kindAdmin && b.reports.listen != "") {
			continue
		}
		if zone == "." || slices.Contains(b.names, zone) {
			cands = append(cands, b)
		}
	}
	admins.Unlock()
	switch {
	case len(cands) == 0:
		refuse(w, http.StatusNotFound, "no_reports", "no ogs block takes reports for this zone on this listener")
		return
	case len(cands) > 1:
		refuse(w, http.StatusBadRequest, "ambiguous", "several ogs blocks take reports here: name one with ?zone=NAME")
		return
	}
	cands[0].serveReport(w, r)
}

func (o *OGS) serveReport(w http.ResponseWriter, r *http.Request) {
	rc := o.reports
	now := time.Now()
	src := rc.source(r)
	if src == nil {
		refuse(w, http.StatusBadRequest, "source", "no source address")
		return
	}
	srcNet := rc.sourceNet(src)
	if !rc.bySource.Allow(srcNet, now) {
		w.Header().Set("Retry-After", "1")
		refuse(w, http.StatusTooManyRequests, "rate_limited_source", "too many reports from this network")
		return
	}
	// RFC 7235 §2.1: the scheme is case-insensitive.
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	ok = ok && strings.EqualFold(scheme, "Bearer")
	id, known := rc.tokens.Lookup(strings.TrimSpace(token), now)
	if !ok || !known {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ogs reports"`)
		refuse(w, http.StatusUnauthorized, "unauthorized", "a known bearer token is required")
		return
	}
	if !rc.byToken.Allow(id, now) {
		w.Header().Set("Retry-After", "1")
		refuse(w, http.StatusTooManyRequests, "rate_limited_token", "too many reports with this token")
		return
	}
	if r.ContentLength > rc.maxBody {
		refuse(w, http.StatusRequestEntityTooLarge, "too_large", "body above report_max_body")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rc.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			refuse(w, http.StatusRequestEntityTooLarge, "too_large", "body above report_max_body")
			return
		}
		refuse(w, http.StatusBadRequest, "malformed", "reading the body: "+err.Error())
		return
	}
	rep, err := rttreports.DecodeReport(body)
	key := maskedNet(src, o.v4Prefix, o.v6Prefix)
	reporter := id + "|" + srcNet
	if err == nil {
		err = o.sel.AddReport(key, reporter, rep, now)
	}
	var trouble *gatewaysel.StoreTrouble
	if errors.As(err, &trouble) {
		// Accepted here, answered from this replica's reports; counted
		// (store_errors_total, through onStore) and written again once
		// Redis answers.
		err = nil
	}
	var ref *rttreports.Refusal
	if errors.As(err, &ref) {
		refuse(w, http.StatusBadRequest, ref.Reason, ref.Detail)
		return
	} else if err != nil {
		refuse(w, http.StatusBadRequest, "malformed", err.Error())
		return
	}
	reportsTotal.WithLabelValues("accepted").Inc()
	reportLocations.WithLabelValues(o.state).Set(float64(o.sel.Reports().Len()))
	a := reportAnswer{Accepted: true, Location: key, Reporter: reporter, Source: "probed"}
	if _, n, ok := o.sel.Reports().Order(key, now); ok {
		a.Source, a.Reporters = "reports", n
	} else {
		a.Reporters = n
	}
	writeReportAnswer(w, http.StatusAccepted, a)
}

// source is the report's source address: the peer's, or, when the peer is
// a trusted proxy, the right-most X-Forwarded-For address that is not one
// (the nearest hop the trusted proxies saw). A body never names it.
func (rc *reportConfig) source(r *http.Request) net.IP {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !rc.isTrusted(ip) {
		return ip
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := net.ParseIP(strings.TrimSpace(hops[i]))
		if hop == nil {
			return ip // a hop we cannot read: the proxy itself is the source
		}
		if !rc.isTrusted(hop) {
			return hop
		}
		ip = hop
	}
	return ip
}

// sourceNet is src masked to the source prefix: the key of the per-source
// rate limit, and with the token id a reporter's identity.
func (rc *reportConfig) sourceNet(src net.IP) string {
	return maskedNet(src, rc.v4Source, rc.v6Source)
}

func (rc *reportConfig) isTrusted(ip net.IP) bool {
	for _, n := range rc.trusted {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}
