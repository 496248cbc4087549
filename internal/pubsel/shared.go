package pubsel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"
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

// SharedConfig configures the shared level of a State's sticky table.
type SharedConfig struct {
	Store Store
	// Name says which store it is, for the admin view ("redis main").
	Name string
	// Prefix namespaces the keys: "<key_prefix>:latency_bucket:<policy>".
	Prefix string
	// Timeout bounds each store call made on a request's path (default
	// DefaultSharedTimeout).
	Timeout time.Duration
	// Recheck is how often a store known to be down is pinged (default
	// DefaultRecheck); until a ping answers, no request calls it.
	Recheck time.Duration
	// OnHealth, if set, is called when the store is marked down (with the
	// error) and when it is back (nil error). It is not compared when a
	// reload decides whether the store changed.
	OnHealth func(healthy bool, err error)
}

// Defaults of SharedConfig.
const (
	DefaultSharedTimeout = 50 * time.Millisecond
	DefaultRecheck       = time.Second
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

func (c *SharedConfig) setDefaults() {
	orDefault(&c.Timeout, DefaultSharedTimeout)
	orDefault(&c.Recheck, DefaultRecheck)
}

// SharedStats counts what the shared level did; a State keeps one across
// reloads and store changes.
type SharedStats struct {
	SharedHits atomic.Uint64 // answered by the store (a local miss)
	Misses     atomic.Uint64 // the store had no entry: a new pick
	Stale      atomic.Uint64 // the store's publisher is inactive or unavailable here: re-picked, rewritten
	Malformed  atomic.Uint64 // a value that is not one of the pool's publishers, too long, or of the wrong type
	Errors     atomic.Uint64 // store calls that failed or timed out
	Skipped    atomic.Uint64 // store calls not made because the store is known to be down
	Writes     atomic.Uint64 // pins written to the store
	Adopted    atomic.Uint64 // a pin written by another replica in the instant of our own pick, taken instead
	Refreshes  atomic.Uint64 // store entries renewed for pairs in use from the local table
}

// maxRefreshes bounds the renewals in flight; past it a renewal is skipped
// (the pair's next epoch tries again).
const maxRefreshes = 64

// Shared is the store level of one State's sticky table, with the store's
// health: a call that fails or times out marks the store down, requests
// then skip it (picks stay local), and a ping every Recheck brings it back.
type Shared struct {
	cfg   SharedConfig
	stats *SharedStats
	ttl   atomic.Int64 // the sticky TTL, ns

	healthy   atomic.Bool
	rechecker atomic.Bool // a recheck loop is running
	closed    atomic.Bool
	inflight  atomic.Int32 // renewals under way

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

	mu        sync.Mutex
	lastError string
	errorAt   time.Time
	downSince time.Time
}

func newShared(cfg SharedConfig, stats *SharedStats, ttl time.Duration) *Shared {
	cfg.setDefaults()
	s := &Shared{cfg: cfg, stats: stats}
	s.setTTL(ttl)
	s.healthy.Store(true)
	return s
}

// SharedHealth is the store's state as the policy sees it.
type SharedHealth struct {
	Healthy   bool
	LastError string
	ErrorAt   time.Time // zero if never
	DownSince time.Time // zero while healthy
	Timeout   time.Duration
	Name      string
	Prefix    string
}

// Health returns the store's state.
func (s *Shared) Health() SharedHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := SharedHealth{Healthy: s.healthy.Load(), LastError: s.lastError, ErrorAt: s.errorAt, Timeout: s.cfg.Timeout,
		Name: s.cfg.Name, Prefix: s.cfg.Prefix}
	if !h.Healthy {
		h.DownSince = s.downSince
	}
	return h
}

func (s *Shared) close() { s.closed.Store(true) }

// setTTL changes the TTL (a reload); the epoch is recomputed at the next
// pick.
func (s *Shared) setTTL(ttl time.Duration) {
	s.ttl.Store(int64(ttl))
	s.epochEnd.Store(0)
}

// epochAt returns the epoch at now (unix ns): two atomic loads, but for
// the first call of each epoch.
func (s *Shared) epochAt(now int64) uint32 {
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
func (s *Shared) refresh(user, app, addr string) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return
	}
	if s.inflight.Add(1) > maxRefreshes {
		s.inflight.Add(-1)
		s.stats.Skipped.Add(1)
		return
	}
	go func() {
		defer s.inflight.Add(-1)
		key := s.Key(user, app)
		ttl := time.Duration(s.ttl.Load())
		ctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.Timeout, 250*time.Millisecond))
		defer cancel()
		_, err := s.cfg.Store.Get(ctx, key, ttl)
		if errors.Is(err, ErrNotFound) {
			_, err = s.cfg.Store.SetNX(ctx, key, addr, ttl)
		}
		if err != nil && !errors.Is(err, ErrWrongType) {
			s.fail(err)
			return
		}
		s.stats.Refreshes.Add(1)
	}()
}

// Key is the store key of a (user, app) pair: the prefix, then the pair
// escaped ("%" and ":" and every byte outside printable ASCII as %XX, the
// two joined by ":"), or "sha256:" and the hex digest of that when it is
// longer than 200 bytes, so a key's length is bounded whatever the client
// sends.
func (s *Shared) Key(user, app string) string { return SharedKey(s.cfg.Prefix, user, app) }

// SharedKey is Shared.Key for a given prefix.
func SharedKey(prefix, user, app string) string {
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
// counted); bad says an entry is there but malformed (to be overwritten).
func (s *Shared) lookup(key string) (addr string, ok, bad bool) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return "", false, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	v, err := s.cfg.Store.Get(ctx, key, time.Duration(s.ttl.Load()))
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		s.stats.Misses.Add(1)
		return "", false, false
	case errors.Is(err, ErrWrongType):
		s.stats.Malformed.Add(1)
		return "", false, true
	default:
		s.fail(err)
		return "", false, false
	}
	if !wellFormed(v) {
		s.stats.Malformed.Add(1)
		return "", false, true
	}
	return v, true, false
}

// wellFormed says whether v can be a publisher address: not empty, not
// too long, printable ASCII without spaces.
func wellFormed(v string) bool {
	if v == "" || len(v) > MaxValueLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] >= 0x7f {
			return false
		}
	}
	return true
}

// claim writes a new pick of key: SET NX, so that of two replicas picking
// one pair in the same instant the first write wins; the loser gets the
// winner's address back (won false) and should use it. With overwrite (the
// entry pointed at a publisher unusable here) it sets whatever was there.
func (s *Shared) claim(key, addr string, overwrite bool) (winner string, won bool) {
	if !s.healthy.Load() {
		s.stats.Skipped.Add(1)
		return "", true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	ttl := time.Duration(s.ttl.Load())
	if overwrite {
		if err := s.cfg.Store.Set(ctx, key, addr, ttl); err != nil {
			s.fail(err)
			return "", true
		}
		s.stats.Writes.Add(1)
		return "", true
	}
	set, err := s.cfg.Store.SetNX(ctx, key, addr, ttl)
	if err != nil {
		s.fail(err)
		return "", true
	}
	if set {
		s.stats.Writes.Add(1)
		return "", true
	}
	v, err := s.cfg.Store.Get(ctx, key, ttl)
	if err != nil || !wellFormed(v) {
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrWrongType) {
			s.fail(err)
		}
		return "", true
	}
	return v, false
}

// fail counts a failed call, records it, and marks the store down until a
// ping answers.
func (s *Shared) fail(err error) {
	s.stats.Errors.Add(1)
	now := time.Now()
	s.mu.Lock()
	s.lastError, s.errorAt = err.Error(), now
	wasHealthy := s.healthy.Load()
	if wasHealthy {
		s.downSince = now
	}
	s.mu.Unlock()
	s.healthy.Store(false)
	if wasHealthy && s.cfg.OnHealth != nil {
		s.cfg.OnHealth(false, err)
	}
	if s.rechecker.CompareAndSwap(false, true) {
		go s.recheck()
	}
}

// recheck pings the store every Recheck until it answers (or the Shared is
// replaced), then marks it healthy.
func (s *Shared) recheck() {
	t := time.NewTicker(s.cfg.Recheck)
	defer t.Stop()
	for range t.C {
		if s.closed.Load() {
			s.rechecker.Store(false)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.Timeout, 250*time.Millisecond))
		err := s.cfg.Store.Ping(ctx)
		cancel()
		if err == nil {
			// In this order: a failure right after healthy is set starts
			// a new recheck loop.
			s.rechecker.Store(false)
			s.healthy.Store(true)
			if s.cfg.OnHealth != nil {
				s.cfg.OnHealth(true, nil)
			}
			return
		}
		s.mu.Lock()
		s.lastError, s.errorAt = err.Error(), time.Now()
		s.mu.Unlock()
	}
}
