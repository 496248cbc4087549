package quota

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// Config is one cluster-wide limit: Limit requests per second per peer,
// shared by all replicas with the same Prefix.
type Config struct {
	Prefix  string // store key prefix (module and profile name)
	Replica string // this replica's unique name
	Limit   float64
	Burst   int // cluster-wide burst; 0: ratelimit.DefaultBurst(Limit)

	Interval         time.Duration // sync interval; default 250 ms
	Floor            float64       // floor share, a fraction of the equal share; default 0.1
	ReplicaTTL       time.Duration // heartbeat lifetime; default 4 intervals
	MaxPeers         int           // tracked peers; default 10,000
	IdleSyncs        int           // syncs without traffic before a peer is dropped; default 4
	ExpectedReplicas int           // replica count assumed before the first sync; default 1

	defaultBurst bool // Burst was 0: shares get at least shareTolerance (see apply)
}

// shareTolerance is the least burst tolerance, in time, of a share under
// the default burst: twice a local limit's 50 ms (ratelimit.DefaultBurst).
// A share's bucket loses the capacity of any pause in its arrivals longer
// than its tolerance; through three bin/caddy replicas on a loaded 2-core
// machine, 50 ms lost up to 3–4 % of the limit over 10 s, and 100 ms costs
// at most R × 0.1 s more admitted after a pause of every replica at once.
const shareTolerance = 100 * time.Millisecond

func (c *Config) defaults() error {
	if c.Replica == "" {
		return fmt.Errorf("replica name is empty")
	}
	if !(c.Limit > 0) || math.IsInf(c.Limit, 0) {
		return fmt.Errorf("limit %v: must be a positive number per second", c.Limit)
	}
	if c.Burst < 0 {
		return fmt.Errorf("burst %d: must not be negative", c.Burst)
	}
	if c.Burst == 0 {
		c.Burst, c.defaultBurst = ratelimit.DefaultBurst(c.Limit), true
	}
	if c.Interval == 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.Interval < time.Millisecond {
		return fmt.Errorf("sync interval %v: must be at least 1ms", c.Interval)
	}
	if c.Floor == 0 {
		c.Floor = 0.1
	}
	if c.Floor < 0 || c.Floor > 1 {
		return fmt.Errorf("floor %v: must be within 0-1 (a fraction of the equal share)", c.Floor)
	}
	if c.ReplicaTTL == 0 {
		c.ReplicaTTL = 4 * c.Interval
	}
	if c.ReplicaTTL < c.Interval {
		return fmt.Errorf("replica TTL %v: must be at least the sync interval %v", c.ReplicaTTL, c.Interval)
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = 10000
	}
	if c.MaxPeers < 1 {
		return fmt.Errorf("max peers %d: must be positive", c.MaxPeers)
	}
	if c.IdleSyncs == 0 {
		c.IdleSyncs = 4
	}
	if c.ExpectedReplicas == 0 {
		c.ExpectedReplicas = 1
	}
	if c.IdleSyncs < 1 || c.ExpectedReplicas < 1 {
		return fmt.Errorf("idle syncs %d, expected replicas %d: must be positive", c.IdleSyncs, c.ExpectedReplicas)
	}
	return nil
}

// Quota is one replica's side of a cluster-wide limit. Allow is safe for
// concurrent use; Sync is called by one timer (calls are serialized).
type Quota struct {
	cfg   Config
	store Store
	clock func() time.Time // the local clock (time.Now)

	// The store's clock: offset (ns) to add to the local clock, from the
	// TIME of the syncs (the sample of least round trip of the last
	// clockSamples); epochs, heartbeat scores and replica TTLs are
	// computed on the local clock plus it.
	offset     atomic.Int64
	clockKnown atomic.Bool
	samples    []clockSample // under syncMu

	throttle atomic.Int64 // percent of the limit withheld

	mu       sync.RWMutex
	peers    map[string]*peer
	overflow *peer // shared by new peers beyond MaxPeers

	syncMu sync.Mutex // serializes Sync; guards the peers' sync fields
	// repairs are keys to delete at the next sync (under syncMu).
	repairs []string
	stMu    sync.Mutex
	st      State
	// Epochs of the last successful and failed syncs.
	lastOK, lastFailed int64
}

type peer struct {
	lim                limiter
	admitted, demanded atomic.Uint64

	frac float64 // share as a fraction of the limit (under Quota.mu)

	// Sync's own (under syncMu).
	own [2]epochCount // this replica's demand written per epoch
	// Smoothed own and cluster demand per epoch (EWMA), so that shares
	// follow the demand's rate rather than one interval's noise.
	ownE, totE float64
	idle       int   // syncs in a row without traffic
	markedAt   int64 // last epoch whose counts this replica wrote marked (field r)
	lostAt     int64 // last epoch whose own count the store did not take
	fallbackAt int64 // last epoch at which the peer's keys were in trouble

	trouble *PeerTrouble // the last sync's store trouble for its keys (under Quota.mu)
}

func newPeer() *peer {
	return &peer{lostAt: math.MinInt64, fallbackAt: math.MinInt64, markedAt: math.MinInt64}
}

// PeerTrouble says why a peer's share is the fallback share: the store
// could not read or write one of its keys at the last sync.
type PeerTrouble struct {
	Peer   string
	Key    string    // the key the failing command touched
	Reason string    // Store.Classify's reason: noperm, clusterdown, timeout, …
	Error  string    // the store's error
	Since  time.Time // first sync of this trouble (same key and reason)
}

type epochCount struct {
	epoch int64
	d     uint64
}

func (p *peer) addOwn(e int64, d uint64) {
	for i := range p.own {
		if p.own[i].epoch == e {
			p.own[i].d += d
			return
		}
	}
	i := 0
	if p.own[1].epoch < p.own[0].epoch {
		i = 1
	}
	p.own[i] = epochCount{e, d}
}

func (p *peer) ownAt(e int64) uint64 {
	for _, c := range p.own {
		if c.epoch == e {
			return c.d
		}
	}
	return 0
}

// State is what the admin view shows of a replica's quota.
type State struct {
	Replica     string
	Replicas    int       // live replicas at the last sync (or assumed)
	LastSync    time.Time // last successful sync
	LastAttempt time.Time
	Healthy     bool // the last sync succeeded for every key it touched
	Fallback    bool // every share is limit ÷ Replicas (store unreachable, or the heartbeat refused)
	// Reserving: this replica marked its last heartbeat (Batch.Reserving):
	// it enforces the fallback share for some peer until its next sync.
	Reserving bool
	// Reserved is how many other live replicas were counted at their
	// fallback share at the last sync (marked, or missed their last
	// sync): every peer's proportional shares divide what they leave.
	Reserved int
	// FallbackPeers is the number of peers whose share is limit ÷
	// Replicas because the store could not read or write their keys at
	// the last sync (all tracked peers while Fallback).
	FallbackPeers int
	LastError     string // of the last store trouble: the key and the store's error
	LastReason    string // its reason (Store.Classify)
	StoreErrors   uint64 // failed syncs (round trip or heartbeat)
	// Errors counts store trouble by reason (Store.Classify): one per
	// failed sync and one per key a successful sync could not read or
	// write.
	// ClockOffset is this replica's clock minus the store's (TIME),
	// measured over a round trip of ClockRTT; ClockKnown: measured.
	ClockOffset, ClockRTT time.Duration
	ClockKnown            bool
	Errors                map[string]uint64
	Malformed             uint64 // store answers ignored (did not parse)
	Repaired              uint64 // keys the limiter owns deleted because they held values it did not write
	Peers                 int    // tracked peers
	Overflowed            uint64 // requests of new peers beyond MaxPeers
	Limit                 float64
	Effective             float64 // the limit after throttling
	Throttle              int
}

// New returns a replica's quota over store, on the local wall clock.
func New(cfg Config, store Store) (*Quota, error) { return NewWithClock(cfg, store, time.Now) }

// NewWithClock returns a replica's quota over store whose local clock is
// clock: the times given to Allow and Sync are read from it, and it is
// read again when a sync's round trip ends (to measure the store's clock
// against it).
func NewWithClock(cfg Config, store Store, clock func() time.Time) (*Quota, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	q := &Quota{cfg: cfg, store: store, clock: clock, peers: map[string]*peer{}, lastOK: math.MinInt64, lastFailed: math.MinInt64}
	q.st = State{Replica: cfg.Replica, Replicas: cfg.ExpectedReplicas, Limit: cfg.Limit, Effective: cfg.Limit}
	q.overflow = newPeer()
	q.st.Errors = map[string]uint64{}
	q.mu.Lock()
	q.overflow.frac = q.floorFrac(cfg.ExpectedReplicas)
	q.apply(q.overflow, 0)
	q.mu.Unlock()
	return q, nil
}

// SetStore replaces the store (a reload's new client for the same
// store): shares, counts and state are kept. It waits for a sync in
// progress.
func (q *Quota) SetStore(s Store) {
	q.syncMu.Lock()
	q.store = s
	q.syncMu.Unlock()
}

// Config returns the configuration with defaults filled in.
func (q *Quota) Config() Config { return q.cfg }

func (q *Quota) floorFrac(replicas int) float64 { return q.cfg.Floor / float64(replicas) }

func (q *Quota) effective() float64 {
	return q.cfg.Limit * float64(100-q.throttle.Load()) / 100
}

// apply sets p's limiter from its fraction at now (under q.mu). The burst
// is the cluster-wide burst scaled to the share, at least 2 (see
// ratelimit.Rule.BurstAt for why not 1).
func (q *Quota) apply(p *peer, now int64) {
	rate := p.frac * q.effective()
	if old := p.lim.rule.Load(); (old == nil && !(rate > 0)) || (old != nil && old.Rate == rate) {
		return
	}
	burst := max(2, int(math.Ceil(float64(q.cfg.Burst)*rate/q.cfg.Limit)))
	if q.cfg.defaultBurst {
		burst = max(burst, 1+int(math.Ceil(rate*shareTolerance.Seconds())))
	}
	p.lim.set(shareRule(rate, burst), now)
}

// Allow admits one request of peer at now (unix ns) under this replica's
// share, or refuses it, and counts it for the next sync.
func (q *Quota) Allow(key string, now int64) bool {
	p := q.lookup(key, now)
	p.demanded.Add(1)
	if !p.lim.allow(now) {
		return false
	}
	p.admitted.Add(1)
	return true
}

// Refund gives back one admission of key that a later check refused (a
// message-type limit's admission when the overall limit refuses the
// message): its share's bucket and the admitted count it reports.
func (q *Quota) Refund(key string, now int64) {
	p := q.lookup(key, now)
	if r := p.lim.rule.Load(); r != nil {
		p.lim.bucket.Refund(r)
	}
	for {
		a := p.admitted.Load()
		if a == 0 || p.admitted.CompareAndSwap(a, a-1) {
			return
		}
	}
}

func (q *Quota) lookup(key string, now int64) *peer {
	q.mu.RLock()
	p := q.peers[key]
	q.mu.RUnlock()
	if p != nil {
		return p
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if p = q.peers[key]; p != nil {
		return p
	}
	if len(q.peers) >= q.cfg.MaxPeers {
		q.stMu.Lock()
		q.st.Overflowed++
		q.stMu.Unlock()
		return q.overflow
	}
	p = newPeer()
	q.stMu.Lock()
	n, fallback := q.st.Replicas, q.st.Fallback
	q.stMu.Unlock()
	if fallback {
		p.frac = 1 / float64(n)
	} else {
		p.frac = q.floorFrac(n)
	}
	q.apply(p, now)
	q.peers[key] = p
	return p
}

// SetThrottle withholds pct percent (0–100) of the cluster-wide limit from
// now on: every share follows at once.
func (q *Quota) SetThrottle(pct int, now time.Time) {
	q.throttle.Store(int64(min(max(pct, 0), 100)))
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.peers {
		q.apply(p, now.UnixNano())
	}
	q.apply(q.overflow, now.UnixNano())
	q.stMu.Lock()
	q.st.Throttle, q.st.Effective = int(q.throttle.Load()), q.effective()
	q.stMu.Unlock()
}

// Epoch returns the epoch of t, a time of the local clock: the store's
// epoch at that moment.
func (q *Quota) Epoch(t time.Time) int64 {
	return floorDiv(t.UnixNano()+q.offset.Load(), int64(q.cfg.Interval))
}

// storeTime is the store's clock at local time t.
func (q *Quota) storeTime(t time.Time) time.Time { return t.Add(time.Duration(q.offset.Load())) }

func floorDiv(a, b int64) int64 {
	d := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		d--
	}
	return d
}

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
	if !q0.clockKnown.Load() {
		// Before the first sync: the store's clock, so that its epoch is
		// the others' (one round trip more, once).
		ans, err := q0.store.Sync(ctx, &Batch{Prefix: q0.cfg.Prefix, Replica: q0.cfg.Replica, Now: now, Time: true, NoHeartbeat: true})
		recv := q0.clock()
		if err == nil && ans != nil {
			q0.clockSample(now, recv, ans.Time, ans.TimeErr)
			now = recv
		}
	}
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
		q.offset.Store(q0.offset.Load())
		q.clockKnown.Store(q0.clockKnown.Load())
		st := q0.State()
		q.stMu.Lock()
		q.st.ClockKnown, q.st.ClockOffset, q.st.ClockRTT = st.ClockKnown, st.ClockOffset, st.ClockRTT
		q.stMu.Unlock()
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
		if d > 0 || p.ownAt(e-1) > 0 {
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
			p.lostAt = e
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
			if p.trouble != nil && p.trouble.Key == t.Key && p.trouble.Reason == t.Reason {
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

type verdict int

const (
	fine       verdict = iota
	badValue           // a field that is not a count
	lostCounts         // a total below this replica's own counts
)

// share computes p's new fraction from the totals of epoch e−1; −1 keeps
// the current one. known: this replica's counts of e−1 are all in the
// store; returning: it wrote none there (it missed that sync), so the
// total is the others' demand alone. reserved of the n replicas are
// counted at their fallback share, limit ÷ n each (their demand is not
// in the total): the others divide what is left, limit × (n − reserved)
// ÷ n, by the same rules among n − reserved.
func (q *Quota) share(p *peer, raw Raw, e int64, n, reserved int, known, returning bool) (float64, verdict) {
	if _, ok := parseCount(raw.Admitted); !ok {
		return -1, badValue
	}
	total, ok := parseCount(raw.Demanded)
	if !ok {
		return -1, badValue
	}
	// The marked replicas that counted this peer in e−1 are at their
	// proportional share for it (their demand is in the total): no room
	// is left for them. This replica's own mark is not in reserved.
	marked, ok := parseCount(raw.Marked)
	if !ok {
		return -1, badValue
	}
	if p.markedAt == e-1 && marked > 0 {
		marked--
	}
	reserved = max(0, reserved-int(min(marked, uint64(n))))
	own := p.ownAt(e - 1)
	if total < own {
		return -1, lostCounts // the store lost or rewrote our counts
	}
	floor := q.floorFrac(n)
	perEpoch := q.effective() * q.cfg.Interval.Seconds()
	left, among := perEpoch*float64(n-reserved)/float64(n), float64(n-reserved)
	switch {
	case own > 0:
		if p.totE == 0 {
			p.ownE, p.totE = float64(own), float64(total)
		} else {
			p.ownE += smoothing * (float64(own) - p.ownE)
			p.totE += smoothing * (float64(total) - p.totE)
		}
		// Below what is left, each replica gets its demand and an equal
		// part of the rest; above, a part in proportion to its demand.
		// Either way the shares add up to what is left, and with the
		// reserved replicas' fallback shares to the limit.
		if spare := left - p.totE; spare > 0 {
			return max(floor, (p.ownE+spare/among)/perEpoch), fine
		}
		return max(floor, left/perEpoch*p.ownE/p.totE), fine
	case total == 0 && (known || returning):
		return 1 / float64(n), fine
	case returning:
		// The others' shares give each of them its demand and an equal
		// part of what is spare: this replica takes that part (none when
		// their demand fills the limit), not its share of before, which
		// the others have been admitting meanwhile.
		return max(floor, (left-float64(total))/among/perEpoch), fine
	case !known:
		return -1, fine
	default:
		return floor, fine
	}
}

// smoothing is the EWMA weight of the newest epoch's demand. 1 (no
// smoothing) so that a dead replica's share returns at the next epoch;
// the simulation measures what smoothing would trade (BENCHMARKS.md).
var smoothing = 1.0

// fallback gives every peer limit ÷ n; it returns the number of peers.
func (q *Quota) fallback(n int, now int64) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.peers {
		p.frac, p.trouble = 1/float64(n), nil
		q.apply(p, now)
	}
	q.overflow.frac = q.floorFrac(n)
	q.apply(q.overflow, now)
	return len(q.peers)
}

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

// clockSample is one measure of the store's clock: offset to add to the
// local clock, round trip it was measured over.
type clockSample struct{ offset, rtt time.Duration }

// clockSamples is how many recent measures the offset is chosen from (the
// one of least round trip: a slow answer, e.g. a stalled store, measures
// the offset worst).
const clockSamples = 8

// clockSlack is the disagreement, beyond both measures' round trips,
// taken as a step of a clock (NTP stepping the host, a VM resumed): the
// older measures are dropped.
const clockSlack = 2 * time.Millisecond

// clockSample takes the store's clock st, read by a command sent at local
// time sent and answered at recv (under syncMu).
func (q *Quota) clockSample(sent, recv, st time.Time, err error) {
	if err != nil || st.IsZero() {
		return
	}
	rtt := max(recv.Sub(sent), 0)
	s := clockSample{offset: st.Sub(sent.Add(rtt / 2)), rtt: rtt}
	if len(q.samples) > 0 {
		cur := q.bestSample()
		if d := s.offset - cur.offset; d > (s.rtt+cur.rtt)/2+clockSlack || -d > (s.rtt+cur.rtt)/2+clockSlack {
			q.samples = q.samples[:0]
		}
	}
	if len(q.samples) == clockSamples {
		q.samples = q.samples[1:]
	}
	q.samples = append(q.samples, s)
	best := q.bestSample()
	q.offset.Store(int64(best.offset))
	q.clockKnown.Store(true)
	q.stMu.Lock()
	q.st.ClockKnown, q.st.ClockOffset, q.st.ClockRTT = true, -best.offset, best.rtt
	q.stMu.Unlock()
}

func (q *Quota) bestSample() clockSample {
	best := q.samples[0]
	for _, s := range q.samples[1:] {
		if s.rtt <= best.rtt {
			best = s
		}
	}
	return best
}
