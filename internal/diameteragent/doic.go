package diameteragent

import (
	"bytes"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/olrshare"
)

// DOIC turns on overload control (RFC 7683, RFC 8581) and load
// information (RFC 8583); nil leaves those AVPs to pass through untouched.
// The rules are in doc.go.
type DOIC struct {
	// ReportRealm adds a REALM report (the routed group's throttle) to the
	// answers to clients that advertised OC-Supported-Features.
	ReportRealm bool
	// Validity of the agent's reports; 0: the group's reversal hold.
	Validity time.Duration
	// Refusal is what a request throttled by a report in force gets
	// (default 3004 DIAMETER_TOO_BUSY, "overload: throttled by DOIC").
	Refusal Refusal
	// MaxReports bounds the table of reports in force (default 10 000).
	MaxReports int
}

const defaultDOICMessage = "overload: throttled by DOIC"

func (o *DOIC) normalize() error {
	switch {
	case o.Validity < 0 || o.Validity > doic.MaxValidity:
		return fmt.Errorf("doic: validity %v: want 1s to 24h (RFC 7683 §7.4)", o.Validity)
	case o.Validity != 0 && o.Validity < time.Second:
		return fmt.Errorf("doic: validity %v: want 1s to 24h (RFC 7683 §7.4)", o.Validity)
	case o.MaxReports < 0:
		return fmt.Errorf("doic: max_reports %d: may not be negative", o.MaxReports)
	}
	def(&o.MaxReports, doic.DefaultMaxReports)
	def(&o.Refusal.ResultCode, uint32(ResultTooBusy))
	def(&o.Refusal.ErrorMessage, defaultDOICMessage)
	return checkRefusal("doic", o.Refusal)
}

// ourFeatures is what the agent supports and advertises.
const ourFeatures = doic.FeatureLoss | doic.FeaturePeerReport

// overload is the agent's DOIC state; it outlives configurations.
type overload struct {
	table *doic.Table

	enc atomic.Pointer[encodings]

	throttled, sent atomic.Int64
}

// encodings are the agent's own AVPs, made once per identity.
type encodings struct {
	identity string // the Origin-Host they name
	request  []byte // OC-Supported-Features for requests (SourceID: the agent)
	answer   []byte // OC-Supported-Features for answers
	load     []byte // the agent's Load template (PEER, SourceID: the agent)
}

// encodings returns the agent's OC-Supported-Features for requests and
// answers and its Load template, made again when its identity changes.
func (o *overload) encodings(host string) (req, ans, load []byte) {
	e := o.enc.Load()
	if e == nil || e.identity != host {
		e = &encodings{identity: host, request: doic.EncodeSupported(ourFeatures, host),
			answer: doic.EncodeSupported(ourFeatures, host), load: doic.EncodeLoad(doic.LoadPeer, 0, host)}
		o.enc.Store(e)
	}
	return e.request, e.answer, e.load
}

// groupReport is what the agent reports for a group: its throttle as a
// PEER report (SourceID: the agent) and as a REALM report. Made when the
// throttle or the configuration changes, appended to answers as they are.
type groupReport struct {
	seq       uint64
	reduction int
	validity  time.Duration
	peer      []byte
	realm     []byte
	until     time.Time // an ended report (reduction 0) is sent until then
}

// reportThrottle records group gr's throttle pct (a.mu or the throttler's
// lock held by the caller, one at a time per group): a new sequence number
// when what is reported changes (the time in ms, so it rises across
// restarts too).
func (a *Agent) reportThrottle(gr *group, cfg *Config, pct int) {
	if cfg.DOIC == nil || gr.Dynamic == nil {
		gr.st.report.Store(nil)
		return
	}
	validity := cfg.DOIC.Validity
	if validity == 0 {
		validity = min(max(gr.Dynamic.Controller.Hold().Round(time.Second), time.Second), doic.MaxValidity)
	}
	old := gr.st.report.Load()
	if old != nil && old.reduction == pct && old.validity == validity {
		return
	}
	if old == nil && pct == 0 {
		return // nothing was reported: nothing to end
	}
	now := a.clock.Now()
	seq := uint64(now.UnixMilli())
	if old != nil && seq <= old.seq {
		seq = old.seq + 1
	}
	r := &groupReport{seq: seq, reduction: pct, validity: validity}
	v := validity
	if pct == 0 {
		v, r.until = 0, now.Add(validity) // RFC 7683 §5.5.2: validity 0 ends it
	}
	r.peer = doic.EncodeOLR(doic.PeerReport, seq, uint32(pct), v, cfg.OriginHost)
	r.realm = doic.EncodeOLR(doic.RealmReport, seq, uint32(pct), v, "")
	gr.st.report.Store(r)
}

// react applies the reports in force to a request for target in group gr
// (realm: its Destination-Realm; pinned: its Destination-Host or binding
// names target). It returns the server to send to, or nil when the request
// is throttled.
func (a *Agent) react(gr *group, target *upstream, realm []byte, pinned bool, now time.Time) *upstream {
	t := a.oc.table
	if r := t.Lookup(doic.RealmReport, realm, now); r != nil && r.Throttle() {
		return nil
	}
	if !a.hostThrottled(target, now) {
		return target
	}
	if pinned {
		return nil
	}
	alt, _ := gr.pick(target)
	gr.st.rr.Add(^uint32(0)) // a diversion takes no turn: the reported host's share stays what the policy gives it
	if alt != nil && !a.hostThrottled(alt, now) {
		return alt
	}
	return nil
}

// hostThrottled applies u's HOST or PEER report (the larger) to one
// request.
func (a *Agent) hostThrottled(u *upstream, now time.Time) bool {
	host := []byte(u.cfg.Host) // no copy: the compiler sees it does not escape
	r := a.oc.table.Lookup(doic.HostReport, host, now)
	if p := a.oc.table.Lookup(doic.PeerReport, host, now); p != nil && (r == nil || p.Reduction > r.Reduction) {
		r = p
	}
	return r != nil && r.Throttle()
}

// readReports takes the OC-OLR and Load AVPs of answer msg (scanned
// into in) from server u.
func (a *Agent) readReports(u *upstream, msg []byte, in *msgInfo) {
	now := a.clock.Now()
	var found doic.Found
	doic.Scan(msg[20:], &found)
	f := &found
	t := a.oc.table
	for _, d := range f.OLRs[:f.NOLR] {
		o, r := doic.ParseOLR(d)
		if r != doic.OK {
			t.Count(r)
			continue
		}
		name := in.originHost
		switch o.Type {
		case doic.RealmReport:
			name = in.originRealm
		case doic.PeerReport:
			if !bytes.EqualFold(o.SourceID, []byte(u.cfg.Host)) {
				t.Count(doic.PeerNotAdjacent)
				continue
			}
			name = []byte(u.cfg.Host)
		}
		if r, taken := t.Apply(name, o, now); r == doic.OK {
			a.log.Debug("DOIC report", "from", u.cfg.Host, "type", o.Type.String(), "sequence", o.Seq, "reduction", o.Reduction, "validity", o.Validity)
			if s := a.reports.Load(); taken && s != nil {
				s.Publish(o.Type, strings.ToLower(string(name)), o.Seq, o.Reduction, o.Validity)
			}
		}
	}
	for _, d := range f.Loads[:f.NLoad] {
		l, r := doic.ParseLoad(d)
		if r != doic.OK {
			t.Count(r)
			continue
		}
		// A PEER load is the adjacent server's; a HOST load names its
		// host by SourceID (else the answer's Origin-Host).
		target := u
		if l.Type == doic.LoadHost {
			src := l.SourceID
			if len(src) == 0 {
				src = in.originHost
			}
			target, _ = lookupLower(a.gen.Load().peers, src)
		}
		if target != nil {
			target.load.Store(int64(l.Value) + 1) // 0: none yet
		}
	}
}

// relayAnswer is the copy of an answer from a server that goes back to
// p's sender: with DOIC on, the servers' OC-OLR, OC-Supported-Features and
// Load taken out (the agent is the reacting node) and the agent's own
// added — its Load always; its OC-Supported-Features and its group's
// reports to a client that advertised OC-Supported-Features.
func (a *Agent) relayAnswer(p *pending, msg []byte, in *msgInfo) []byte {
	cfg := &a.gen.Load().cfg
	if cfg.DOIC == nil || in == nil {
		return answerCopy(msg, p.origHbh)
	}
	_, ans, load := a.oc.encodings(cfg.OriginHost)
	out := make([]byte, 20, len(msg)+len(ans)+len(load)+160)
	copy(out, msg[:20])
	if in.hasOC {
		out = doic.AppendStripped(out, msg[20:])
	} else {
		out = append(out, msg[20:]...)
	}
	if p.clientFeatures != 0 {
		out = a.appendReports(out, cfg, p.group, p.clientFeatures)
	}
	out = doic.AppendLoad(out, load, p.group.agentLoad())
	n := len(out)
	out[1], out[2], out[3] = byte(n>>16), byte(n>>8), byte(n)
	setHopByHop(out, p.origHbh)
	return out
}

// refuseReporting refuses a request routed to group gr (the egress limit,
// or a report in force) as refuse does; a client that advertised DOIC
// gets the agent's OC-Supported-Features and the group's reports in the
// refusal as in a relayed answer.
func (a *Agent) refuseReporting(d *downstream, msg []byte, in *msgInfo, gr *group, r Refusal) {
	cfg := &a.gen.Load().cfg
	features := uint64(0)
	if cfg.DOIC != nil {
		features = clientFeatures(msg, in)
	}
	if r.Drop || features == 0 {
		a.refuse(d, in, r)
		return
	}
	a.answerSelfWith(d.link, in, r.ResultCode, r.ErrorMessage, func(b []byte) []byte {
		return a.appendReports(b, cfg, gr, features)
	})
}

// appendReports appends the agent's OC-Supported-Features and group gr's
// reports for a client with features to answer b, and fixes its length.
func (a *Agent) appendReports(b []byte, cfg *Config, gr *group, features uint64) []byte {
	_, ans, _ := a.oc.encodings(cfg.OriginHost)
	b = append(b, ans...)
	if r := gr.st.report.Load(); r != nil && (r.reduction > 0 || a.clock.Now().Before(r.until)) {
		if features&doic.FeaturePeerReport != 0 {
			b = append(b, r.peer...)
		}
		if cfg.DOIC.ReportRealm {
			b = append(b, r.realm...)
		}
		a.oc.sent.Add(1)
	}
	n := len(b)
	b[1], b[2], b[3] = byte(n>>16), byte(n>>8), byte(n)
	return b
}

// agentLoad is the load the agent reports for a group, 0–65535: the
// larger of the group's pending requests over its max_pending and its
// dynamic load source's last reading.
func (g *group) agentLoad() uint64 {
	frac := float64(g.st.pending.Load()) / float64(max(g.MaxPending, 1))
	if l := g.st.dynLoad.Load(); l > 0 {
		frac = max(frac, float64(l)/10000)
	}
	return uint64(min(max(frac, 0), 1) * doic.MaxLoadValue)
}

// clientFeatures reads the OC-Feature-Vector of request msg's
// OC-Supported-Features (0: the client did not advertise DOIC).
func clientFeatures(msg []byte, in *msgInfo) uint64 {
	if !in.hasOC {
		return 0
	}
	var found doic.Found
	if doic.Scan(msg[20:], &found); !found.HasSupported {
		return 0
	}
	f, _ := doic.ParseSupported(found.Supported)
	return f
}

// DOICView is the overload control state for the admin view.
type DOICView struct {
	// Reports in force that servers sent (the reductions the agent applies).
	Reports []doic.ReportView `json:"reports"`
	// ReportsReceived counts valid OC-OLRs read; Ignored, by reason, the
	// OC-OLR and Load AVPs ignored.
	ReportsReceived int64            `json:"reports_received"`
	Ignored         map[string]int64 `json:"ignored"`
	// Throttled counts requests refused by a report in force.
	Throttled int64 `json:"throttled"`
	// ReportsSent counts answers that carried the agent's own OC-OLR.
	ReportsSent int64 `json:"reports_sent"`
	// Store is the reports' shared level (absent: local only).
	Store *olrshare.View `json:"store,omitempty"`
}

// SentReportView is a group's report in the agent's answers.
type SentReportView struct {
	Sequence  uint64        `json:"sequence"`
	Reduction int           `json:"reduction_percent"`
	Validity  time.Duration `json:"validity_ns"`
}

func (a *Agent) doicView(now time.Time) *DOICView {
	t := a.oc.table
	v := &DOICView{Reports: t.View(now), ReportsReceived: t.Received(), Ignored: map[string]int64{},
		Throttled: a.oc.throttled.Load(), ReportsSent: a.oc.sent.Load()}
	if v.Reports == nil {
		v.Reports = []doic.ReportView{}
	}
	for _, r := range doic.Reasons() {
		v.Ignored[r.String()] = t.Ignored(r)
	}
	if s := a.reports.Load(); s != nil {
		sv := s.View()
		v.Store = &sv
	}
	return v
}

func (st *groupState) sentView() *SentReportView {
	r := st.report.Load()
	if r == nil {
		return nil
	}
	return &SentReportView{Sequence: r.seq, Reduction: r.reduction, Validity: r.validity}
}

// loadValue is u's last Load-Value, or nil.
func (u *upstream) loadValue() *uint64 {
	if v := u.load.Load(); v > 0 {
		x := uint64(v - 1)
		return &x
	}
	return nil
}
