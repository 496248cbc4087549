package diameteragent

import (
	"fmt"
	"sync/atomic"
	"time"
)

// route decides and forwards a request from downstream peer d, in order:
//
//  1. a Route-Record naming the agent: 3005 DIAMETER_LOOP_DETECTED;
//  2. the ingress limit of d's Origin-Host and the message type;
//  3. no Destination-Realm: 3002 if a Destination-Host is given (RFC 6733
//     §7.1.3), else 5005 DIAMETER_MISSING_AVP;
//  4. a Destination-Host that is an OKAY peer of the table: that peer (in
//     the routed group if it is a member, else its first group);
//  5. the realm routing table: (realm, application), (realm, any),
//     (any realm, application), (any realm, any), then the default group;
//     nothing matched: 3003 DIAMETER_REALM_NOT_SERVED when the realm is in
//     no route, else 3002 (the realm is served, not this application);
//  6. the Session-Id's binding, while its server is OKAY in that group;
//     else the group's policy picks a server (3002 if none is OKAY, 3004
//     if those OKAY are all full);
//  7. (DOIC on) the overload reports in force (doc.go): a throttled
//     request goes to another member or gets the doic refusal (3004);
//  8. the group's pending bound: 3004 DIAMETER_TOO_BUSY at once when full;
//  9. the group's egress limit (key: the group's name);
//  10. forward with a Route-Record naming d and the agent's own Hop-by-Hop
//     id; bind the session to the server, or end the binding if the
//     request ends the session (CCR-T, STR).
func (a *Agent) route(d *downstream, msg []byte, in *msgInfo) {
	g := a.gen.Load()
	now := a.clock.Now()
	if !a.screen(d, in, g, now) {
		return
	}
	r, ok := a.destination(d, in, g)
	if !ok || !a.server(d, in, &r, now) {
		return
	}
	if oc := g.cfg.DOIC; oc != nil && !a.oc.table.Empty() {
		if r.target = a.react(r.gr, r.target, in.destRealm, r.pinned, now); r.target == nil {
			a.oc.throttled.Add(1)
			a.refuseReporting(d, msg, in, r.gr, oc.Refusal)
			return
		}
	}
	if a.reserve(d, msg, in, r.gr, now) {
		a.send(d, msg, in, g, &r, now)
	}
}

// routing is a request's routing decision as route takes it.
type routing struct {
	gr      *group
	target  *upstream // the server; nil until one is known
	pinned  bool      // target fixed by the Destination-Host or the binding
	key     uint64    // the Session-Id's binding key (0: no Session-Id)
	boundTo uint32    // the server id of the binding found (0: none)
}

// screen applies steps 1–3: the loop check, the ingress limit and the
// Destination-Realm's presence. False: the request was answered (or
// dropped).
func (a *Agent) screen(d *downstream, in *msgInfo, g *generation, now time.Time) bool {
	if in.loop {
		a.answerSelf(d.link, in, ResultLoopDetected, "the agent's identity is in the Route-Record")
		return false
	}
	if p := g.cfg.Ingress; p != nil {
		if ok, _ := p.Decide(d.host, in.info().Type(), now.UnixNano()); !ok {
			a.counts.ingressRefused.Add(1)
			a.refuse(d, in, g.cfg.IngressRefusal)
			return false
		}
	}
	switch {
	case in.hasDestRealm:
		return true
	case in.hasDestHost:
		a.answerSelf(d.link, in, ResultUnableToDeliver, "Destination-Host without Destination-Realm")
	default:
		a.answerSelf(d.link, in, ResultMissingAVP, "Destination-Realm missing")
	}
	return false
}

// destination applies steps 4–5: the group by the realm routing table and
// the server a Destination-Host names. False: no route (answered 3003 or
// 3002).
func (a *Agent) destination(d *downstream, in *msgInfo, g *generation) (routing, bool) {
	gr, known := g.lookup(in.destRealm, in.hdr.ApplicationID)
	var target *upstream
	if in.hasDestHost {
		if u, _ := lookupLower(g.peers, in.destHost); u != nil && u.current() != nil {
			if gr == nil || gr.member(u.id) == nil {
				gr = g.groupOf[u]
			}
			if gr != nil {
				target = u
			}
		}
	}
	switch {
	case gr != nil:
		return routing{gr: gr, target: target, pinned: target != nil}, true
	case known:
		a.answerSelf(d.link, in, ResultUnableToDeliver, fmt.Sprintf("no route for application %d in realm %s", in.hdr.ApplicationID, in.destRealm))
	default:
		a.answerSelf(d.link, in, ResultRealmNotServed, "realm not served: "+string(in.destRealm))
	}
	return routing{}, false
}

// server applies step 6: the session's binding while its server is OKAY
// in the group, else the group's policy. False: no server (answered 3004
// or 3002).
func (a *Agent) server(d *downstream, in *msgInfo, r *routing, now time.Time) bool {
	if len(in.sessionID) > 0 {
		r.key = a.sessionKey(in.sessionID)
		if r.target == nil {
			if id, ok := a.boundServer(r.key, in, now); ok {
				r.boundTo = id
				if u := r.gr.member(id); u != nil && u.current() != nil {
					r.target, r.pinned = u, true
				}
			}
		}
	}
	if r.target != nil {
		return true
	}
	gr := r.gr
	target, full := gr.pick(nil)
	switch {
	case target != nil:
		r.target = target
		return true
	case full:
		gr.st.busy.Add(1)
		a.answerSelf(d.link, in, ResultTooBusy, "every server of group "+gr.Name+" has its maximum of pending requests")
	default:
		gr.st.unavailable.Add(1)
		a.answerSelf(d.link, in, ResultUnableToDeliver, "no server of group "+gr.Name+" is available")
	}
	return false
}

// testHookSent, set by tests only, runs once a request is handed to its
// server's connection (as a preempted goroutine would pause there).
var testHookSent atomic.Pointer[func()]

// reserve applies steps 8–9: a place among the group's pending requests,
// then its egress limit. True: the place is taken (send releases it).
func (a *Agent) reserve(d *downstream, msg []byte, in *msgInfo, gr *group, now time.Time) bool {
	if gr.st.pending.Add(1) > int64(gr.MaxPending) {
		gr.st.pending.Add(-1)
		gr.st.busy.Add(1)
		a.answerSelf(d.link, in, ResultTooBusy, "group "+gr.Name+" has its maximum of pending requests")
		return false
	}
	if p := gr.Egress; p != nil {
		if ok, _ := p.Decide(gr.Name, in.info().Type(), now.UnixNano()); !ok {
			gr.st.pending.Add(-1)
			gr.st.refused.Add(1)
			a.refuseReporting(d, msg, in, gr, gr.Refusal)
			return false
		}
	}
	return true
}

// send applies step 10: it records the binding, then forwards the
// request to r's server, or, when that one has gone since, to another the
// group's policy picks (the binding moves with it).
func (a *Agent) send(d *downstream, msg []byte, in *msgInfo, g *generation, r *routing, now time.Time) {
	gr, target := r.gr, r.target
	var extra []byte
	var features uint64
	if g.cfg.DOIC != nil {
		// The agent is the reacting node for every request it routes: it
		// advertises DOIC for a client that did not (RFC 7683 §5.2).
		if features = clientFeatures(msg, in); features == 0 {
			extra, _, _ = a.oc.encodings(g.cfg.OriginHost)
		}
	}
	p := &pending{from: d.link, origHbh: in.hdr.HopByHopID, msg: forwarded(msg, d.host, extra), sent: now,
		group: gr, session: r.key, ends: in.isTermination(), clientFeatures: features}
	// The binding is recorded before the request leaves, so that a request
	// of the session sent once this one's answer is back finds it.
	first := target
	if r.key != 0 {
		a.bound(r.key, in, r.boundTo, first, p.ends, now)
	}
	// The server picked may have gone since: pick again, among the others.
	for tried := 0; ; tried++ {
		res := closed
		if l := target.current(); l != nil {
			p.peer = target
			res = a.forward(p, l, gr.MaxPendingPerPeer, gr.RequestTimeout)
		}
		if res == sent {
			if f := testHookSent.Load(); f != nil {
				(*f)()
			}
			break
		}
		anyFull := false
		if res == full {
			target = nil
		} else if target, anyFull = gr.pick(target); tried > len(gr.members) {
			target = nil
		}
		if target == nil {
			if r.key != 0 && r.boundTo == 0 && !p.ends {
				a.bindings.Delete(r.key) // the request went nowhere: no binding
			}
			gr.st.pending.Add(-1)
			if res == full || anyFull {
				gr.st.busy.Add(1)
				a.answerSelf(d.link, in, ResultTooBusy, "the next hop has too many requests pending")
			} else {
				gr.st.unavailable.Add(1)
				a.answerSelf(d.link, in, ResultUnableToDeliver, "no server of group "+gr.Name+" is available")
			}
			return
		}
	}
	gr.st.admitted.Add(1)
	if r.key != 0 && target != first && !p.ends {
		a.bound(r.key, in, first.id, target, false, now) // it moved with the request
	}
}

// refuse answers a request a rate limit refused, or drops it.
func (a *Agent) refuse(d *downstream, in *msgInfo, r Refusal) {
	if !r.Drop {
		a.answerSelf(d.link, in, r.ResultCode, r.ErrorMessage)
	}
}

// lookup finds the group for (realm, app); known reports whether any
// route names the realm.
func (g *generation) lookup(realm []byte, app uint32) (gr *group, known bool) {
	if rr, ok := lookupLower(g.realms, realm); ok {
		known = true
		if gr = rr.byApp[app]; gr != nil {
			return gr, true
		}
		if rr.any != nil {
			return rr.any, true
		}
	}
	if gr = g.anyRealm.byApp[app]; gr != nil {
		return gr, known
	}
	if g.anyRealm.any != nil {
		return g.anyRealm.any, known
	}
	return g.fallback, known
}
