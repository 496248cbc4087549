package pubsel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/storefault"
)

// Store is the shared second level of the sticky table: a key-value store
// with expiry that every replica of a cluster reads and writes (Redis in
// production, MemStore in tests). Values are publisher addresses.
type Store interface {
	// Get returns key's value and renews its expiry to ttl (Redis GETEX);
	// ErrNotFound if there is none, ErrWrongType if the key holds
	// something that is not a string.
	Get(ctx context.Context, key string, ttl time.Duration) (string, error)
	// SetNX sets key to value with expiry ttl unless it exists, and
	// reports whether it did.
	SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error)
	// Set sets key to value with expiry ttl, whatever was there.
	Set(ctx context.Context, key, value string, ttl time.Duration) error
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// Errors a Store returns for what is not a failure of the store.
var (
	ErrNotFound  = errors.New("pubsel: no such key")
	ErrWrongType = errors.New("pubsel: key holds a value of another type")
)

// StickyStoreConfig configures the shared level of a State's sticky table.
type StickyStoreConfig struct {
	Store Store
	// Name says which store it is, for the admin view ("redis main").
	Name string
	// Prefix namespaces the keys: "<key_prefix>:latency_bucket:<policy>".
	Prefix string
	// Timeout bounds each store call made on a request's path (default
	// DefaultStickyStoreTimeout).
	Timeout time.Duration
	// Recheck is how often a store known to be down is pinged (default
	// DefaultRecheck); until a ping answers, no request calls it. It is
	// also the least time between two reconciliation attempts of one pin.
	Recheck time.Duration
	// DownFailures and DownAfter are the evidence a store must give before
	// it is marked unreachable: DownFailures calls in a row that got no
	// answer (a timeout, a refused or reset connection; no call answered
	// in between), the first of them at least DownAfter before the last
	// (defaults DefaultDownFailures, DefaultDownAfter). One slow answer on
	// a busy host is not a down store.
	DownFailures int
	DownAfter    time.Duration
	// RefusalHold is how long after the last key the store refused (an
	// error reply: NOPERM, READONLY, OOM…) it is still reported as
	// refusing (default DefaultRefusalHold).
	RefusalHold time.Duration
	// OnHealth, if set, is called when the store is marked unreachable
	// (with the error) and when it is back (nil error); OnRefusal when it
	// starts refusing keys (with the reason, the key and the error) and
	// when it has refused none for RefusalHold (refusing false). Calls are
	// made one at a time, in the order of the transitions. They are not
	// compared when a reload decides whether the store changed.
	OnHealth  func(healthy bool, err error)
	OnRefusal func(refusing bool, reason, key string, err error)
}

// Defaults of StickyStoreConfig.
const (
	DefaultStickyStoreTimeout = 50 * time.Millisecond
	DefaultRecheck            = time.Second
	DefaultDownFailures       = 3
	DefaultDownAfter          = time.Second
	DefaultRefusalHold        = 10 * time.Second
)

// Bounds on what is read from and written to the store.
const (
	// MaxValueLen is the longest value taken as a publisher address (a
	// 253-byte host name, brackets, a colon and a port).
	MaxValueLen = 263
	// maxPairLen is the longest escaped (user, app) pair put in a key as
	// is; a longer one is replaced by its SHA-256.
	maxPairLen = 200
)

func (c *StickyStoreConfig) setDefaults() {
	orDefault(&c.Timeout, DefaultStickyStoreTimeout)
	orDefault(&c.Recheck, DefaultRecheck)
	orDefault(&c.DownFailures, DefaultDownFailures)
	orDefault(&c.DownAfter, DefaultDownAfter)
	orDefault(&c.RefusalHold, DefaultRefusalHold)
}

// StickyStoreStats counts what the shared level did; a State keeps one across
// reloads and store changes.
type StickyStoreStats struct {
	StoreHits atomic.Uint64 // answered by the store (a local miss)
	Misses    atomic.Uint64 // the store had no entry: a new pick
	Stale     atomic.Uint64 // the store's publisher is inactive or unavailable here: re-picked, rewritten
	Malformed atomic.Uint64 // a value that is not one of the pool's publishers, too long, or of the wrong type
	Errors    atomic.Uint64 // store calls that failed or timed out
	Skipped   atomic.Uint64 // store calls not made because the store is known to be down
	Writes    atomic.Uint64 // pins written to the store
	Adopted   atomic.Uint64 // a pin written by another replica in the instant of our own pick, taken instead
	Refreshes atomic.Uint64 // store entries renewed for pairs in use from the local table
	// Reconciliation of pins made here without the store's word (a call
	// failed, or the store was unreachable): written to the store (it had
	// none, or ours), or replaced here by the pin another replica wrote.
	Reconciled       atomic.Uint64
	ReconcileAdopted atomic.Uint64
	PendingDropped   atomic.Uint64 // pins not tracked for reconciliation: the list was full

	reasonsMu sync.Mutex
	reasons   map[string]uint64 // Errors by reason; at most maxReasons keys

	// pending is kept with the counts: a reload that rebuilds the shared
	// level (a new timeout) still reconciles the pins made before it.
	pending pendingSet
}

// ErrorsByReason returns Errors split by the reason of each failure (a
// word of the Store's StoreError, "timeout" or "other").
func (st *StickyStoreStats) ErrorsByReason() map[string]uint64 {
	st.reasonsMu.Lock()
	defer st.reasonsMu.Unlock()
	out := make(map[string]uint64, len(st.reasons))
	for k, v := range st.reasons {
		out[k] = v
	}
	return out
}

// maxReasons bounds the reasons counted apart; others count as "other".
const maxReasons = 32

func (st *StickyStoreStats) countReason(reason string) {
	st.reasonsMu.Lock()
	defer st.reasonsMu.Unlock()
	if st.reasons == nil {
		st.reasons = map[string]uint64{}
	}
	if _, ok := st.reasons[reason]; !ok && len(st.reasons) >= maxReasons {
		reason = "other"
	}
	st.reasons[reason]++
}

// Pending returns how many local pins await reconciliation with the store.
func (st *StickyStoreStats) Pending() int { return int(st.pending.n.Load()) }

// StoreError is what a Store returns for a call the store could not do
// (not ErrNotFound, not ErrWrongType): the adapter classifies its client's
// error once and says what it means here (internal/storefault).
type StoreError = storefault.Error

// Trouble reads a failed call's error: its reason word and whether the
// store answered (StoreError; a context deadline is "timeout").
func Trouble(err error) (reason string, answered bool) { return storefault.Read(err) }

// maxRefreshes bounds the renewals and reconciliations in flight; past it
// one is skipped (a renewal waits for the pair's next epoch, a
// reconciliation for the pair's next hit).
const maxRefreshes = 64

// StickyStore is the store level of one State's sticky table, with the store's
// health. A call that fails or times out lets the request go on locally
// and leaves its pin pending, to be reconciled with the store at a later
// hit; the store is marked unreachable only on the evidence StickyStoreConfig
// describes (calls without an answer in a row, over DownAfter), requests
// then skip it (picks stay local), and a ping every Recheck brings it back.
type StickyStore struct {
	cfg   StickyStoreConfig
	stats *StickyStoreStats
	ttl   atomic.Int64 // the sticky TTL, ns

	healthy  atomic.Bool
	failing  atomic.Int32 // calls in a row without an answer (mirrors streak)
	inflight atomic.Int32 // renewals and reconciliations under way

	// The goroutines the store starts (background calls, the recheck and
	// refusal loops) end before close returns: ctx, cancelled by close,
	// ends their waits and store calls; wg counts them; goMu orders each
	// start against close, so none starts once close has begun.
	ctx    context.Context
	cancel context.CancelFunc
	goMu   sync.RWMutex
	closed bool // under goMu
	wg     sync.WaitGroup

	// The epoch is now ÷ (TTL/2), mod 4, kept in the tag of each local
	// pin when it is synced with the store. A hit on a pin tagged with
	// another epoch renews the store entry (and retags the pin). A pin
	// with the current tag was synced in this epoch: a pin idle for the
	// three epochs a wrap-around takes has expired locally (1.5 TTL), so
	// its store entry, renewed for a TTL at the sync, outlives the epoch
	// by at least TTL/2. So an entry never expires while its pair is in
	// use on some replica.
	epoch    atomic.Uint32
	epochEnd atomic.Int64 // unix ns at which the current epoch ends
	epochMu  sync.Mutex

	// eventMu orders the health and refusal callbacks as the transitions
	// (taken before mu wherever a transition may happen).
	eventMu sync.Mutex

	mu            sync.Mutex
	streak        int       // calls in a row without an answer
	streakSince   time.Time // the first of them
	rechecking    bool      // a recheck loop runs
	lastError     string
	lastReason    string
	errorAt       time.Time
	downSince     time.Time
	refusing      bool
	watching      bool // a refusal watcher runs
	refusingSince time.Time
	refusedAt     time.Time
	refusedKey    string
	refusedReason string
}

func newStickyStore(cfg StickyStoreConfig, stats *StickyStoreStats, ttl time.Duration) *StickyStore {
	cfg.setDefaults()
	s := &StickyStore{cfg: cfg, stats: stats}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.setTTL(ttl)
	s.healthy.Store(true)
	return s
}

// StickyStoreHealth is the store's state as the policy sees it.
type StickyStoreHealth struct {
	Healthy    bool // false while marked unreachable
	Failing    int  // calls in a row that got no answer (0: the last call was answered)
	LastError  string
	LastReason string    // the last failure's reason word
	ErrorAt    time.Time // zero if never
	DownSince  time.Time // zero while healthy
	// Refusing: the store answered an error reply for some key within
	// RefusalHold; RefusedKey is the last key it refused, and why.
	Refusing      bool
	RefusingSince time.Time // zero while not refusing
	RefusedKey    string
	RefusedReason string
	RefusedAt     time.Time
	Timeout       time.Duration
	Name          string
	Prefix        string
}

// Health returns the store's state.
func (s *StickyStore) Health() StickyStoreHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := StickyStoreHealth{Healthy: s.healthy.Load(), Failing: s.streak, LastError: s.lastError, LastReason: s.lastReason,
		ErrorAt: s.errorAt, Refusing: s.refusing, RefusedKey: s.refusedKey, RefusedReason: s.refusedReason,
		RefusedAt: s.refusedAt, Timeout: s.cfg.Timeout, Name: s.cfg.Name, Prefix: s.cfg.Prefix}
	if !h.Healthy {
		h.DownSince = s.downSince
	}
	if h.Refusing {
		h.RefusingSince = s.refusingSince
	}
	return h
}

// setTTL changes the TTL (a reload); the epoch is recomputed at the next
// pick.
func (s *StickyStore) setTTL(ttl time.Duration) {
	s.ttl.Store(int64(ttl))
	s.epochEnd.Store(0)
}

// epochAt returns the epoch at now (unix ns): two atomic loads, but for
// the first call of each epoch.
func (s *StickyStore) epochAt(now int64) uint32 {
	if now < s.epochEnd.Load() {
		return s.epoch.Load()
	}
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	if now < s.epochEnd.Load() {
		return s.epoch.Load()
	}
	half := max(s.ttl.Load()/2, int64(time.Second))
	n := now / half
	s.epoch.Store(uint32(n & 3))
	s.epochEnd.Store((n + 1) * half)
	return uint32(n & 3)
}

// refresh renews the store entry of a pair in use here, off the request's
// path: GETEX renews an entry that is there (whatever publisher it names:
// another replica's re-pick stays); SET NX restores one that is gone (a
// Redis restarted empty, or an entry that expired).
func (s *StickyStore) refresh(user, app, addr string) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return
	}
	s.inBackground(user, app, func(ctx context.Context, key string, ttl time.Duration) {
		_, err := s.cfg.Store.Get(ctx, key, ttl)
		if errors.Is(err, ErrNotFound) {
			_, err = s.cfg.Store.SetNX(ctx, key, addr, ttl)
		}
		if err != nil && !errors.Is(err, ErrWrongType) {
			s.fail(key, err)
			return
		}
		s.answered()
		s.stats.Refreshes.Add(1)
	})
}

// reconcilable says whether a local hit on table key should start a
// reconciliation: the pin was made without the store's word, the store is
// not known to be down, and the pin's last attempt is older than Recheck.
// Two atomic loads while nothing is pending.
func (s *StickyStore) reconcilable(key uint64, now int64) bool {
	return s.stats.pending.n.Load() > 0 && s.healthy.Load() &&
		s.stats.pending.take(key, now, int64(s.cfg.Recheck), int64(s.ttl.Load()))
}

// reconcile settles, off the request's path, a pin of (user, app) to addr
// made here while the store could not be asked (table key tkey): written
// if the store has no entry (SET NX); kept if the store names addr; if it
// names another publisher, adopt is called with it and, if that publisher
// is usable here (adopt true), the pair follows the store from now on —
// one switch, never back; else (a publisher unusable here, a malformed
// value) addr overwrites it, as a new pick would. A call that fails leaves
// the pin pending: the next hit at least Recheck later tries again.
func (s *StickyStore) reconcile(tkey uint64, user, app, addr string, adopt func(winner string) bool) {
	s.inBackground(user, app, func(ctx context.Context, key string, ttl time.Duration) {
		v, err := s.cfg.Store.Get(ctx, key, ttl)
		if errors.Is(err, ErrNotFound) {
			var set bool
			if set, err = s.cfg.Store.SetNX(ctx, key, addr, ttl); err == nil && set {
				s.answered()
				s.stats.Writes.Add(1)
				s.stats.Reconciled.Add(1)
				s.stats.pending.done(tkey)
				return
			}
			if err == nil {
				v, err = s.cfg.Store.Get(ctx, key, ttl) // written meanwhile: the winner
			}
		}
		if errors.Is(err, ErrWrongType) {
			v, err = "", nil
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			s.fail(key, err)
			return
		}
		s.answered()
		switch {
		case v == addr:
			s.stats.Reconciled.Add(1)
		case wellFormed(v) && adopt(v):
			s.stats.ReconcileAdopted.Add(1)
		default:
			if err := s.cfg.Store.Set(ctx, key, addr, ttl); err != nil {
				s.fail(key, err)
				return
			}
			s.stats.Writes.Add(1)
			s.stats.Reconciled.Add(1)
		}
		s.stats.pending.done(tkey)
	})
}

// Key is the store key of a (user, app) pair: the prefix, then the pair
// escaped ("%" and ":" and every byte outside printable ASCII as %XX, the
// two joined by ":"), or "sha256:" and the hex digest of that when it is
// longer than 200 bytes, so a key's length is bounded whatever the client
// sends.
func (s *StickyStore) Key(user, app string) string { return StickyStoreKey(s.cfg.Prefix, user, app) }

// StickyStoreKey is StickyStore.Key for a given prefix.
func StickyStoreKey(prefix, user, app string) string {
	pair := escape(user) + ":" + escape(app)
	if len(pair) > maxPairLen {
		sum := sha256.Sum256([]byte(pair))
		pair = "sha256:" + hex.EncodeToString(sum[:])
	}
	return prefix + ":" + pair
}

func escape(s string) string {
	const hexDigits = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' || c == ':' || c == '{' || c == '}' {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' || c == ':' || c == '{' || c == '}' {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// lookup reads key's publisher address from the store. ok is false on no
// entry, a malformed value, a failure, or a store known to be down (each
// counted); bad says an entry is there but malformed (to be overwritten);
// unsure says the store was not asked or did not answer.
func (s *StickyStore) lookup(key string) (addr string, ok, bad, unsure bool) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return "", false, false, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	v, err := s.cfg.Store.Get(ctx, key, time.Duration(s.ttl.Load()))
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		s.answered()
		s.stats.Misses.Add(1)
		return "", false, false, false
	case errors.Is(err, ErrWrongType):
		s.answered()
		s.stats.Malformed.Add(1)
		return "", false, true, false
	default:
		s.fail(key, err)
		return "", false, false, true
	}
	s.answered()
	if !wellFormed(v) {
		s.stats.Malformed.Add(1)
		return "", false, true, false
	}
	return v, true, false, false
}

// wellFormed says whether v can be a publisher address: not empty, not
// too long, printable ASCII without spaces.
func wellFormed(v string) bool { return storefault.Word(v, MaxValueLen) }

// claim writes a new pick of key: SET NX, so that of two replicas picking
// one pair in the same instant the first write wins; the loser gets the
// winner's address back (won false) and should use it. With overwrite (the
// entry pointed at a publisher unusable here) it sets whatever was there.
// synced is false when the store was not asked or did not answer: the
// pin is local only, to be reconciled.
func (s *StickyStore) claim(key, addr string, overwrite bool) (winner string, won, synced bool) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return "", true, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	ttl := time.Duration(s.ttl.Load())
	if overwrite {
		if err := s.cfg.Store.Set(ctx, key, addr, ttl); err != nil {
			s.fail(key, err)
			return "", true, false
		}
		s.answered()
		s.stats.Writes.Add(1)
		return "", true, true
	}
	set, err := s.cfg.Store.SetNX(ctx, key, addr, ttl)
	if err != nil {
		s.fail(key, err)
		return "", true, false
	}
	s.answered()
	if set {
		s.stats.Writes.Add(1)
		return "", true, true
	}
	v, err := s.cfg.Store.Get(ctx, key, ttl)
	switch {
	case err == nil && wellFormed(v):
		return v, false, true
	case err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrWrongType):
		// Gone again, or not a publisher: ours stands locally, and the
		// reconciliation writes it.
		return "", true, false
	}
	s.fail(key, err)
	return "", true, false
}
