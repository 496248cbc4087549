package quota

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// NextSync returns when to sync next after now: the middle of the next
// epoch, so that every replica's counts of an epoch are in the store when
// they are read (timer jitter up to half an interval is harmless).
func (q *Quota) NextSync(now time.Time) time.Time {
	iv, off := int64(q.cfg.Interval), q.offset.Load()
	s := now.UnixNano() + off
	t := (floorDiv(s, iv)+1)*iv + iv/2
	if t-iv > s {
		t -= iv
	}
	return time.Unix(0, t-off)
}

// Sync sends the counts since the last sync and recomputes the shares; on
// a store failure it falls back to limit ÷ (last known replicas). It
// returns the store's error, if any (already recorded in State).
func (q *Quota) Sync(ctx context.Context, now time.Time) error {
	return SyncGroup(ctx, now, []*Quota{q})[0]
}

// SyncGroup syncs several quotas of one replica in one round trip of the
// first one's store (when it is a GroupStore; otherwise one per quota):
// a profile's overall limit first, then its message-type limits. Only the
// first batch carries the replica heartbeat; the others take its replica
// count. It returns each quota's error (nil: synced), in order.
func SyncGroup(ctx context.Context, now time.Time, qs []*Quota) []error {
	errs := make([]error, len(qs))
	if len(qs) == 0 {
		return errs
	}
	for _, q := range qs {
		q.syncMu.Lock()
		defer q.syncMu.Unlock()
	}
	q0 := qs[0]
	now = q0.learnClock(ctx, now)
	for _, q := range qs[1:] {
		q.offset.Store(q0.offset.Load())
	}
	ps := make([]*pending, len(qs))
	bs := make([]*Batch, len(qs))
	marked := false
	for i, q := range qs {
		ps[i] = q.prepare(now)
		bs[i] = ps[i].b
		bs[i].NoHeartbeat = i > 0
		marked = marked || ps[i].reserving
	}
	// One heartbeat for the group: marked when any of its quotas
	// reserves (the others then leave room in each of them).
	bs[0].Time = true
	for i, p := range ps {
		p.marked, bs[i].Reserving = marked, marked
	}
	anss := make([]*Answer, len(qs))
	var err error
	if gs, ok := qs[0].store.(GroupStore); ok {
		anss, err = gs.SyncGroup(ctx, bs)
		if err == nil && len(anss) != len(bs) {
			err = fmt.Errorf("store answered %d batches for %d", len(anss), len(bs))
		}
	} else {
		for i, b := range bs {
			if anss[i], err = qs[0].store.Sync(ctx, b); err != nil {
				break
			}
		}
	}
	if err == nil && anss[0] != nil {
		q0.clockSample(now, q0.clock(), anss[0].Time, anss[0].TimeErr)
	}
	for _, q := range qs[1:] {
		q.takeClock(q0)
	}
	// The heartbeat refused for another reason than a value of another
	// type (NOPERM on the replicas key, LOADING, READONLY, OOM, a
	// timeout): the replica count is unknown and this replica is not
	// registered, so every share of the group is the fallback share.
	if err == nil && anss[0] != nil && kindOf(qs[0].store, anss[0].ReplicasErr) == StoreTrouble {
		err = fmt.Errorf("heartbeat %s: %w", ReplicasKey(bs[0].Prefix), anss[0].ReplicasErr)
	}
	for i, q := range qs {
		var ans *Answer
		if err == nil {
			ans = anss[i]
			if i > 0 && ans != nil {
				ans.Replicas, ans.ReplicasErr, ans.Reserved = anss[0].Replicas, anss[0].ReplicasErr, anss[0].Reserved
			}
		}
		errs[i] = q.finish(qs[0].store, ps[i], ans, err)
	}
	return errs
}

// pending is a sync between its batch and the store's answer.
type pending struct {
	b             *Batch
	e             int64
	local         time.Time // the sync's time on the local clock (b.Now is the store's)
	read, counted []*peer
	// reserving: this quota enforces the fallback share for some peer
	// until its next sync whatever this one answers; marked: the
	// group's heartbeat says so (some quota of the group reserves).
	reserving, marked bool
}

// prepare takes the counts since the last sync (under syncMu).
func (q *Quota) prepare(now time.Time) *pending {
	e := q.Epoch(now)
	b := &Batch{
		Prefix: q.cfg.Prefix, Replica: q.cfg.Replica, Now: q.storeTime(now), Epoch: e,
		ReplicaTTL: q.cfg.ReplicaTTL, KeyTTL: 3 * q.cfg.Interval,
		Fresh: time.Unix(0, (e-1)*int64(q.cfg.Interval)),
	}
	ps := &pending{b: b, e: e, local: now}
	b.Repair, q.repairs = q.repairs, nil
	// The last sync failed as a whole: every share is the fallback share.
	failed := q.lastFailed > q.lastOK
	ps.reserving = failed
	q.mu.RLock()
	for k, p := range q.peers {
		a, d := p.admitted.Swap(0), p.demanded.Swap(0)
		a = min(a, d) // refunds may have run ahead of a swap
		// A peer at the fallback share keeps it until this sync's answer
		// (and one more interval: see lostAt), and the others count this
		// replica at its fallback share for it: its counts are not
		// written, which also keeps them out of the others' demand when
		// the store takes a sync whose answer this replica never gets
		// (a link slower than the sync's deadline).
		onFallback := failed || p.trouble != nil
		ps.reserving = ps.reserving || onFallback || (p.lostAt == q.lastOK && p.lostAt != math.MinInt64)
		switch {
		case d > 0 && onFallback:
			p.lostAt = e
			p.idle = 0
		case d > 0:
			b.Counts = append(b.Counts, Count{Peer: k, Admitted: a, Demanded: d})
			ps.counted = append(ps.counted, p)
			p.idle = 0
		default:
			p.idle++
		}
		// A peer whose keys were refused is asked again at every sync,
		// with or without traffic: a zero count (Probe) and the read. Its
		// trouble then ends only when the store takes both, never because
		// a sync left its keys out (an interval without its traffic, or
		// its counts withheld above).
		if p.trouble != nil {
			b.Counts = append(b.Counts, Count{Peer: k, Probe: true})
			ps.counted = append(ps.counted, p)
		}
		if d > 0 || p.ownAt(e-1) > 0 || p.trouble != nil {
			b.Read = append(b.Read, k)
			ps.read = append(ps.read, p)
		}
	}
	q.overflow.admitted.Swap(0)
	q.overflow.demanded.Swap(0)
	q.mu.RUnlock()
	return ps
}

// finish applies the answer of store from (or its error) to the shares
// (under syncMu). Every error is classified once (from.Classify): a value
// that does not parse is ignored, counted and, where the limiter owns the
// key, deleted at the next sync; anything else is store trouble for the
// keys the command touched: their peers get the fallback share,
// limit ÷ replicas, and the state says which and why.
func (q *Quota) finish(from Store, ps *pending, ans *Answer, err error) error {
	b, e, now := ps.b, ps.e, ps.local
	if err == nil && ans == nil {
		err = fmt.Errorf("store gave no answer")
	}
	if err == nil && (len(ans.Totals) != len(b.Read) || len(ans.CountErrs) != len(b.Counts)) {
		err = fmt.Errorf("store answered %d totals for %d peers, %d count results for %d", len(ans.Totals), len(b.Read), len(ans.CountErrs), len(b.Counts))
	}
	if err != nil {
		return q.failed(from, e, now, err)
	}
	o := &outcome{from: from, now: now, troubled: map[*peer]*PeerTrouble{}, errs: map[string]uint64{}}
	n, reserved, prevOK := q.takeHeartbeat(ps, ans, e, now, o)
	q.takeCounts(ps, ans, o)

	// Recompute. If this replica's counts of epoch e−1 may be missing (a
	// failed sync then, or none in it), peers keep their share one more
	// interval instead of reading as idle here.
	known := q.lastFailed < e-1 && (prevOK == e-1 || prevOK == math.MinInt64)
	// Returning: this replica missed syncs without failing any (paused,
	// stalled), so epoch e−1 lacks its counts and the others' shares grew
	// into the room it left. Until it reads an epoch with its counts, each
	// peer's share is what the others leave of e−1 (see share).
	returning := prevOK != math.MinInt64 && e-prevOK > 1 && q.lastFailed < prevOK
	fresh := q.takeTotals(ps, ans, n, reserved, known, returning, o)
	first, inTrouble, peers := q.reshare(o.troubled, fresh, n, e, known || returning, now)

	q.stMu.Lock()
	st := &q.st
	st.Healthy, st.Fallback, st.FallbackPeers = inTrouble == 0, false, inTrouble
	if first != nil {
		st.LastError, st.LastReason = first.Key+": "+first.Error, first.Reason
	}
	for r, k := range o.errs {
		st.Errors[r] += k
	}
	st.Malformed += o.malformed
	st.Repaired += uint64(len(b.Repair))
	st.Peers = peers
	q.stMu.Unlock()
	return nil
}

// outcome is what a sync's answer says besides the shares: the peers
// whose keys the store could not read or write, store trouble by reason,
// and the values that did not parse.
type outcome struct {
	from      Store
	now       time.Time
	troubled  map[*peer]*PeerTrouble
	errs      map[string]uint64
	malformed uint64
}

// trouble records err, store trouble on key of peer p.
func (o *outcome) trouble(p *peer, peerName, key string, err error) {
	o.errs[reasonOf(o.from, err)]++
	if o.troubled[p] == nil {
		o.troubled[p] = &PeerTrouble{Peer: peerName, Key: key, Reason: reasonOf(o.from, err), Error: err.Error(), Since: o.now}
	}
}

// failed records a sync whose round trip failed as a whole (or whose
// heartbeat the store refused): every share is the fallback share.
func (q *Quota) failed(from Store, e int64, now time.Time, err error) error {
	q.stMu.Lock()
	st := &q.st
	st.LastAttempt = now
	st.Healthy, st.Fallback, st.LastError, st.LastReason = false, true, err.Error(), reasonOf(from, err)
	st.Reserving = true // from now until the next sync answers
	st.StoreErrors++
	st.Errors[reasonOf(from, err)]++
	n := st.Replicas
	q.stMu.Unlock()
	q.lastFailed = e
	peers := q.fallback(n, now.UnixNano())
	q.stMu.Lock()
	st.FallbackPeers = peers
	q.stMu.Unlock()
	return err
}

// takeHeartbeat takes the replica count from the answer and records the
// sync; it returns the count and the epoch of the previous good sync.
func (q *Quota) takeHeartbeat(ps *pending, ans *Answer, e int64, now time.Time, o *outcome) (n, reserved int, prevOK int64) {
	b := ps.b
	q.stMu.Lock()
	st := &q.st
	st.LastAttempt = now
	st.Reserving = ps.marked
	switch {
	case ans.ReplicasErr == nil && ans.Replicas >= 1 && ans.Replicas <= 1<<20 && ans.Reserved >= 0 && ans.Reserved <= ans.Replicas:
		st.Replicas = int(ans.Replicas)
		// The others at their fallback share: this replica's own marked
		// heartbeat is among them when it is marked.
		st.Reserved = int(ans.Reserved)
		if ps.marked {
			st.Reserved--
		}
		st.Reserved = min(max(st.Reserved, 0), st.Replicas-1)
	case !b.NoHeartbeat:
		// Another program's key of another type, or a count that is no
		// count (Trouble was the whole sync's error): keep the last
		// known count, and delete the key at the next sync.
		o.malformed++
		q.repair(ReplicasKey(b.Prefix))
	}
	n, reserved = st.Replicas, st.Reserved
	prevOK = q.lastOK
	st.LastSync = now
	q.stMu.Unlock()
	q.lastOK = e
	return n, reserved, prevOK
}

// takeCounts reads the results of the peers' counts of epoch e.
func (q *Quota) takeCounts(ps *pending, ans *Answer, o *outcome) {
	b, e := ps.b, ps.e
	for i, c := range b.Counts {
		p, key := ps.counted[i], PeerKey(b.Prefix, c.Peer, e)
		switch err := ans.CountErrs[i]; kindOf(o.from, err) {
		case NoError, NotFound:
			if c.Probe {
				continue // nothing of this replica's counted: not marked either
			}
			p.addOwn(e, c.Demanded)
			if ps.marked {
				p.markedAt = e // counted in field r of e
			}
		case Malformed:
			// e.g. another program's key of another type: our counts of
			// e are not in the store, so the share is kept one more
			// interval (lostAt) rather than read as idle.
			o.malformed++
			p.lostAt = e
			q.repair(key)
		default:
			if !c.Probe {
				p.lostAt = e
			}
			o.trouble(p, c.Peer, key, err)
		}
	}
}

// takeTotals reads the peers' totals of epoch e−1 and returns their new
// fractions of the limit (peers without one keep theirs).
func (q *Quota) takeTotals(ps *pending, ans *Answer, n, reserved int, known, returning bool, o *outcome) map[*peer]float64 {
	b, e := ps.b, ps.e
	fresh := make(map[*peer]float64, len(ps.read))
	for i, p := range ps.read {
		raw, key := ans.Totals[i], PeerKey(b.Prefix, b.Read[i], e-1)
		switch kindOf(o.from, raw.Err) {
		case NoError, NotFound:
		case Malformed:
			o.malformed++
			q.repair(key)
			continue
		default:
			o.trouble(p, b.Read[i], key, raw.Err)
			continue
		}
		if o.troubled[p] != nil {
			continue
		}
		f, v := q.share(p, raw, e, n, reserved, known && p.lostAt < e-1, returning)
		switch v {
		case badValue:
			o.malformed++
			q.repair(key)
		case lostCounts:
			o.malformed++
		default:
			if f >= 0 {
				fresh[p] = f
			}
		}
	}
	return fresh
}

// reshare applies the new fractions (under mu): a troubled peer gets the
// fallback share, one with a fresh fraction takes it, an idle one whose
// counts are complete (complete: known or returning) falls to the floor,
// and an idle peer with a full bucket is forgotten. It returns the first
// troubled peer by name, the troubled count and the peers tracked.
func (q *Quota) reshare(troubled map[*peer]*PeerTrouble, fresh map[*peer]float64, n int, e int64, complete bool, now time.Time) (first *PeerTrouble, inTrouble, peers int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, p := range q.peers {
		if t := troubled[p]; t != nil {
			// The same reason is the same trouble (the key names the
			// epoch: it changes at every sync).
			if p.trouble != nil && p.trouble.Reason == t.Reason {
				t.Since = p.trouble.Since
			}
			p.trouble, p.frac, p.fallbackAt = t, 1/float64(n), e
			inTrouble++
			if first == nil || t.Peer < first.Peer {
				first = t
			}
			q.apply(p, now.UnixNano())
			continue
		}
		p.trouble = nil
		if f, ok := fresh[p]; ok {
			p.frac = f
		} else if p.idle > 0 && complete && p.fallbackAt < e-1 {
			p.frac = q.floorFrac(n)
		}
		if p.idle >= q.cfg.IdleSyncs && p.lim.full(now.UnixNano()) {
			delete(q.peers, k)
			continue
		}
		q.apply(p, now.UnixNano())
	}
	q.overflow.frac = q.floorFrac(n)
	q.apply(q.overflow, now.UnixNano())
	return first, inTrouble, len(q.peers)
}

// kindOf is what err, an error of store s, means (NoError for nil).
func kindOf(s Store, err error) ErrorKind {
	if err == nil {
		return NoError
	}
	kind, _ := s.Classify(err)
	return kind
}

// reasonOf is the bounded word of an error of store s ("other" when s
// names none).
func reasonOf(s Store, err error) string {
	if _, r := s.Classify(err); r != "" {
		return r
	}
	return "other"
}

// maxRepairs bounds the keys deleted per sync.
const maxRepairs = 64

// repair deletes key at the next sync (under syncMu).
func (q *Quota) repair(key string) {
	if len(q.repairs) < maxRepairs && !slices.Contains(q.repairs, key) {
		q.repairs = append(q.repairs, key)
	}
}

// learnClock asks the store's clock before the first sync, so that this
// replica's epoch is the others' (one round trip more, once). It returns
// the time to sync at.
func (q *Quota) learnClock(ctx context.Context, now time.Time) time.Time {
	if q.clockKnown.Load() {
		return now
	}
	ans, err := q.store.Sync(ctx, &Batch{Prefix: q.cfg.Prefix, Replica: q.cfg.Replica, Now: now, Time: true, NoHeartbeat: true})
	recv := q.clock()
	if err == nil && ans != nil {
		q.clockSample(now, recv, ans.Time, ans.TimeErr)
		return recv
	}
	return now
}

// takeClock copies the group leader's clock offset and its view fields:
// one sample serves every quota of a group.
func (q *Quota) takeClock(from *Quota) {
	q.offset.Store(from.offset.Load())
	q.clockKnown.Store(from.clockKnown.Load())
	st := from.State()
	q.stMu.Lock()
	q.st.ClockKnown, q.st.ClockOffset, q.st.ClockRTT = st.ClockKnown, st.ClockOffset, st.ClockRTT
	q.stMu.Unlock()
}
