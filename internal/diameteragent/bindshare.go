package diameteragent

import (
	"time"

	"github.com/edgesteer/edgesteer/internal/diambind"
)

// Bindings shared by replicas (Config.BindingStore): the local table stays
// the first level, internal/diambind the second. A local binding's value
// is the server's id with, in its top two bits, the renewal epoch it was
// last written to the store in (diambind.Shared.Epoch); without a store
// the tag is 0.
const (
	epochShift = 30
	idMask     = 1<<epochShift - 1
)

// installBindingStore makes, reconfigures or closes the shared level as a
// configuration asks (a.mu held).
func (a *Agent) installBindingStore(cfg *diambind.Config, ttl time.Duration) {
	s := a.shared.Load()
	switch {
	case cfg == nil && s != nil:
		a.shared.Store(nil)
		go s.Close()
	case cfg != nil && s == nil:
		a.shared.Store(diambind.New(*cfg, ttl, a.log, a.adopt))
	case cfg != nil:
		s.Configure(*cfg, ttl)
	}
}

// closeBindingStore stops the shared level's writer.
func (a *Agent) closeBindingStore() {
	if s := a.shared.Swap(nil); s != nil {
		s.Close()
	}
}

// boundServer returns the server id a session is bound to: the local
// binding, else, for a request that continues a session (any request with
// a Session-Id but a CCR-Initial), the store's (read on this local miss
// only, bounded by the store's timeout). A local hit tagged with an old
// epoch queues the renewal of the store's entry, off the request's path.
func (a *Agent) boundServer(key uint64, in *msgInfo, now time.Time) (uint32, bool) {
	sec := uint32(now.Unix())
	v, ok := a.bindings.Get(key, sec)
	s := a.shared.Load()
	if ok {
		if s != nil {
			if e := s.Epoch(now); v>>epochShift != e {
				if u := a.gen.Load().byID[v&idMask]; u != nil {
					a.bindings.Put(key, v&idMask|e<<epochShift, sec)
					s.Claim(in.sessionID, u.cfg.Host)
				}
			}
		}
		return v & idMask, true
	}
	if s == nil || (in.hdr.CommandCode == cmdCCR && in.ccRequestType == ccInitial) {
		return 0, false
	}
	host, found := s.Lookup(in.sessionID)
	if !found {
		return 0, false
	}
	u, _ := lookupLower(a.gen.Load().peers, []byte(host))
	if u == nil {
		s.Stale()
		return 0, false
	}
	a.bindings.Put(key, u.id|s.Epoch(now)<<epochShift, sec)
	return u.id, true
}

// bound records where a forwarded request went: the binding ends with its
// session (CCR-T, STR), is made when there was none (a Claim in the
// store: the first replica to write wins), or moves (overwritten).
func (a *Agent) bound(key uint64, in *msgInfo, was uint32, to *upstream, ends bool, now time.Time) {
	s := a.shared.Load()
	if ends {
		a.bindings.Delete(key)
		a.counts.bindingsEnded.Add(1)
		if s != nil {
			s.End(in.sessionID)
		}
		return
	}
	if was == to.id { // a hit was marked used by Get
		return
	}
	var tag uint32
	if s != nil {
		tag = s.Epoch(now)
	}
	a.bindings.Put(key, to.id|tag<<epochShift, uint32(now.Unix()))
	switch {
	case s == nil:
	case was == 0:
		s.Claim(in.sessionID, to.cfg.Host)
	default:
		s.Move(in.sessionID, to.cfg.Host)
	}
}

// rebind moves a failed-over request's session to the server it was
// re-sent to.
func (a *Agent) rebind(p *pending, to *upstream) {
	s := a.shared.Load()
	if s == nil {
		a.bind(p.session, to)
		return
	}
	a.bindings.Put(p.session, to.id|s.Epoch(a.clock.Now())<<epochShift, a.seconds())
	var in msgInfo
	if scan(p.msg, a.gen.Load().cfg.OriginHost, &in) == nil && len(in.sessionID) > 0 {
		s.Move(in.sessionID, to.cfg.Host)
	}
}

// adopt takes the binding another replica wrote first for a session this
// one bound too (diambind.Adopt): the session goes there from its next
// request, if it is still bound here and the server is in the peer table.
func (a *Agent) adopt(sid, server string) bool {
	u, _ := lookupLower(a.gen.Load().peers, []byte(server))
	if u == nil {
		return false
	}
	key := a.sessionKey([]byte(sid))
	now := a.clock.Now()
	v, ok := a.bindings.Get(key, uint32(now.Unix()))
	if ok && v&idMask != u.id {
		a.bindings.Put(key, u.id|v&^idMask, uint32(now.Unix()))
	}
	return true
}

// BindingStoreView is the shared level's state (nil without a store).
func (a *Agent) BindingStoreView() *diambind.View {
	s := a.shared.Load()
	if s == nil {
		return nil
	}
	v := s.View()
	return &v
}
