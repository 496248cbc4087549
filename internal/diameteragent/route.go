package diameteragent

import (
	"fmt"
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
//  7. the group's pending bound: 3004 DIAMETER_TOO_BUSY at once when full;
//  8. the group's egress limit (key: the group's name);
//  9. forward with a Route-Record naming d and the agent's own Hop-by-Hop
//     id; bind the session to the server, or end the binding if the
//     request ends the session (CCR-T, STR).
func (a *Agent) route(d *downstream, msg []byte, in *msgInfo) {
	g := a.gen.Load()
	if in.loop {
		a.answerSelf(d.link, in, ResultLoopDetected, "the agent's identity is in the Route-Record")
		return
	}
	now := a.clock.Now()
	if p := g.cfg.Ingress; p != nil {
		if ok, _ := p.Decide(d.host, in.info().Type(), now.UnixNano()); !ok {
			a.counts.ingressRefused.Add(1)
			a.refuse(d, in, g.cfg.IngressRefusal)
			return
		}
	}
	if !in.hasDestRealm {
		if in.hasDestHost {
			a.answerSelf(d.link, in, ResultUnableToDeliver, "Destination-Host without Destination-Realm")
		} else {
			a.answerSelf(d.link, in, ResultMissingAVP, "Destination-Realm missing")
		}
		return
	}
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
	if gr == nil {
		if known {
			a.answerSelf(d.link, in, ResultUnableToDeliver, fmt.Sprintf("no route for application %d in realm %s", in.hdr.ApplicationID, in.destRealm))
		} else {
			a.answerSelf(d.link, in, ResultRealmNotServed, "realm not served: "+string(in.destRealm))
		}
		return
	}
	var key uint64
	var boundTo uint32 // the binding found (ids start at 1)
	if len(in.sessionID) > 0 {
		key = a.sessionKey(in.sessionID)
		if target == nil {
			if id, ok := a.bindings.Get(key, uint32(now.Unix())); ok {
				boundTo = id
				if u := gr.member(id); u != nil && u.current() != nil {
					target = u
				}
			}
		}
	}
	if target == nil {
		var full bool
		if target, full = gr.pick(nil); target == nil {
			if full {
				gr.st.busy.Add(1)
				a.answerSelf(d.link, in, ResultTooBusy, "every server of group "+gr.Name+" has its maximum of pending requests")
			} else {
				gr.st.unavailable.Add(1)
				a.answerSelf(d.link, in, ResultUnableToDeliver, "no server of group "+gr.Name+" is available")
			}
			return
		}
	}
	if gr.st.pending.Add(1) > int64(gr.MaxPending) {
		gr.st.pending.Add(-1)
		gr.st.busy.Add(1)
		a.answerSelf(d.link, in, ResultTooBusy, "group "+gr.Name+" has its maximum of pending requests")
		return
	}
	if p := gr.Egress; p != nil {
		if ok, _ := p.Decide(gr.Name, in.info().Type(), now.UnixNano()); !ok {
			gr.st.pending.Add(-1)
			gr.st.refused.Add(1)
			a.refuse(d, in, gr.Refusal)
			return
		}
	}
	p := &pending{from: d.link, origHbh: in.hdr.HopByHopID, msg: forwarded(msg, d.host), sent: now,
		group: gr, session: key, ends: in.isTermination()}
	// The server picked may have gone since: pick again, among the others.
	for tried := 0; ; tried++ {
		res := closed
		if l := target.current(); l != nil {
			p.peer = target
			res = a.forward(p, l, gr.MaxPendingPerPeer, gr.RequestTimeout)
		}
		if res == sent {
			break
		}
		anyFull := false
		if res == full {
			target = nil
		} else if target, anyFull = gr.pick(target); tried > len(gr.members) {
			target = nil
		}
		if target == nil {
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
	if key != 0 {
		if p.ends {
			a.bindings.Delete(key)
			a.counts.bindingsEnded.Add(1)
		} else if boundTo != target.id { // a hit was marked used by Get
			a.bindings.Put(key, target.id, uint32(now.Unix()))
		}
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
