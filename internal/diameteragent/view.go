package diameteragent

import (
	"sort"
	"time"

	"github.com/edgesteer/edgesteer/internal/diambind"
)

// View is the agent's state for an admin endpoint.
type View struct {
	Peers       []PeerView       `json:"peers"`
	Groups      []GroupView      `json:"groups"`
	Routes      []Route          `json:"routes"`
	Default     string           `json:"default_group,omitempty"`
	Downstreams []DownstreamView `json:"downstreams"`
	Bindings    int              `json:"bindings"`
	MaxBindings int              `json:"max_bindings"`
	Counts      Counts           `json:"counts"`
	// DOIC is overload control (absent: off).
	DOIC *DOICView `json:"doic,omitempty"`
	// BindingStore is the bindings' shared level (absent: local only).
	BindingStore *diambind.View `json:"binding_store,omitempty"`
}

// PeerView is an upstream peer: its watchdog state, requests awaiting an
// answer, answer latency (moving average) and the last error.
type PeerView struct {
	Host    string `json:"host"`
	Realm   string `json:"realm"`
	Address string `json:"address"`
	// Applications the agent's CER to it advertises (absent: all).
	Applications []uint32      `json:"applications,omitempty"`
	State        string        `json:"state"`
	Outstanding  int           `json:"outstanding"`
	Latency      time.Duration `json:"latency_ns"`
	LastError    string        `json:"last_error,omitempty"`
	DWRSent      int64         `json:"dwr_sent"`       // the agent's watchdog requests
	DWAReceived  int64         `json:"dwa_received"`   // their answers
	DWRReceived  int64         `json:"dwr_received"`   // the peer's, answered
	Load         *uint64       `json:"load,omitempty"` // its last RFC 8583 Load-Value
}

// GroupView is a peer group's counts.
type GroupView struct {
	Name        string `json:"name"`
	Policy      Policy `json:"policy"`
	Pending     int64  `json:"pending"`
	Admitted    int64  `json:"admitted"`
	Refused     int64  `json:"refused"`     // by the egress limit
	Busy        int64  `json:"busy"`        // answered 3004
	Unavailable int64  `json:"unavailable"` // no server OKAY: 3002
	FailedOver  int64  `json:"failed_over"` // re-sent with the T flag
	TimedOut    int64  `json:"timed_out"`   // answered 3002 at request_timeout
	// Dynamic is the group's dynamic throttling (absent: none).
	Dynamic *DynamicView `json:"dynamic,omitempty"`
	// Report is the agent's DOIC report for the group (absent: none).
	Report *SentReportView `json:"doic_report,omitempty"`
}

// DownstreamView is a connected client peer.
type DownstreamView struct {
	Host    string `json:"host"`
	Realm   string `json:"realm"`
	Pending int    `json:"pending"` // server-initiated requests awaiting its answer
}

// Counts are the agent's own counters.
type Counts struct {
	Late            int64 `json:"late_answers"` // answers to nothing pending: discarded
	Undelivered     int64 `json:"undelivered"`  // a connection's queue was full or closed
	TimedOut        int64 `json:"timed_out"`
	Loops           int64 `json:"loops"`            // 3005
	RealmNotServed  int64 `json:"realm_not_served"` // 3003
	UnableToDeliver int64 `json:"unable_to_deliver"`
	TooBusy         int64 `json:"too_busy"`
	IngressRefused  int64 `json:"ingress_refused"`
	BindingsEnded   int64 `json:"bindings_ended"` // by CCR-T or STR
	DownstreamDWR   int64 `json:"downstream_dwr"` // downstream peers' DWRs, answered
	DownstreamDPR   int64 `json:"downstream_dpr"` // downstream peers' DPRs, answered
}

// View returns the agent's state now.
func (a *Agent) View() View {
	g := a.gen.Load()
	v := View{Routes: g.cfg.Routes, Default: g.cfg.DefaultGroup, Bindings: a.bindings.Len(), MaxBindings: a.bindings.Max()}
	for _, pc := range g.cfg.Peers {
		u := g.peers[pc.Host]
		u.mu.Lock()
		pv := PeerView{Host: pc.Host, Realm: pc.Realm, Address: pc.Address, Applications: pc.Applications, State: State(u.state.Load()).String(),
			Latency: time.Duration(u.latency.Load()), LastError: u.lastErr,
			DWRSent: u.dwrSent.Load(), DWAReceived: u.dwaRecv.Load(), DWRReceived: u.dwrRecv.Load(), Load: u.loadValue()}
		if l := u.link.Load(); l != nil {
			pv.Outstanding = int(l.count.Load())
		}
		u.mu.Unlock()
		v.Peers = append(v.Peers, pv)
	}
	for _, gc := range g.cfg.Groups {
		st := g.groups[gc.Name].st
		v.Groups = append(v.Groups, GroupView{Name: gc.Name, Policy: gc.Policy, Pending: st.pending.Load(),
			Admitted: st.admitted.Load(), Refused: st.refused.Load(), Busy: st.busy.Load(), Unavailable: st.unavailable.Load(),
			FailedOver: st.failedOver.Load(), TimedOut: st.timedOut.Load(), Report: st.sentView()})
		if d := g.groups[gc.Name].Dynamic; d != nil {
			a.mu.Lock()
			t := a.throttlers[gc.Name]
			a.mu.Unlock()
			if t != nil {
				v.Groups[len(v.Groups)-1].Dynamic = t.view(d.Source)
			}
		}
	}
	a.mu.Lock()
	for _, d := range a.downs {
		v.Downstreams = append(v.Downstreams, DownstreamView{Host: d.host, Realm: d.realm, Pending: int(d.link.count.Load())})
	}
	a.mu.Unlock()
	sort.Slice(v.Downstreams, func(i, j int) bool { return v.Downstreams[i].Host < v.Downstreams[j].Host })
	c := &a.counts
	v.Counts = Counts{Late: c.late.Load(), Undelivered: c.undelivered.Load(), TimedOut: c.timedOut.Load(), Loops: c.loops.Load(),
		RealmNotServed: c.realmNotServed.Load(), UnableToDeliver: c.unableToDeliver.Load(), TooBusy: c.tooBusy.Load(),
		IngressRefused: c.ingressRefused.Load(), BindingsEnded: c.bindingsEnded.Load(),
		DownstreamDWR: c.downstreamDWR.Load(), DownstreamDPR: c.downstreamDPR.Load()}
	if g.cfg.DOIC != nil {
		v.DOIC = a.doicView(a.clock.Now())
	}
	v.BindingStore = a.BindingStoreView()
	return v
}
