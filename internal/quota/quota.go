package quota

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

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

	// trouble is the store's last answer of trouble for its keys (under
	// Quota.mu): kept until a sync's answer takes them (see prepare's
	// probe), through syncs that failed as a whole.
	trouble *PeerTrouble
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
	Since  time.Time // first sync of this trouble (same reason, in a row)
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
