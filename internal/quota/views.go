package quota

import (
	"maps"
	"sort"
)

// State returns the replica's state for the admin view.
func (q *Quota) State() State {
	q.stMu.Lock()
	defer q.stMu.Unlock()
	st := q.st
	st.Errors = maps.Clone(q.st.Errors)
	return st
}

// Troubles returns the peers at the fallback share because the store could
// not read or write their keys at the last sync, by peer, at most limit of
// them (0: all).
func (q *Quota) Troubles(limit int) []PeerTrouble {
	q.mu.RLock()
	var out []PeerTrouble
	for _, p := range q.peers {
		if p.trouble != nil {
			out = append(out, *p.trouble)
		}
	}
	q.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// PeerShare is one tracked peer's share.
type PeerShare struct {
	Peer     string
	Share    float64 // requests per second admitted here
	Fraction float64 // of the effective cluster-wide limit
	Trouble  string  // why the share is the fallback share (Store.Classify), if it is for its keys
}

// Shares returns the tracked peers' shares, largest first, at most limit
// of them (0: all).
func (q *Quota) Shares(limit int) []PeerShare {
	q.mu.RLock()
	eff := q.effective()
	out := make([]PeerShare, 0, len(q.peers))
	for k, p := range q.peers {
		ps := PeerShare{Peer: k, Share: p.frac * eff, Fraction: p.frac}
		if p.trouble != nil {
			ps.Trouble = p.trouble.Reason
		}
		out = append(out, ps)
	}
	q.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Share != out[j].Share {
			return out[i].Share > out[j].Share
		}
		return out[i].Peer < out[j].Peer
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// Share returns peer's share in requests per second, if tracked.
func (q *Quota) Share(key string) (float64, bool) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	p := q.peers[key]
	if p == nil {
		return 0, false
	}
	return p.frac * q.effective(), true
}
