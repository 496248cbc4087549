package diambind

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/storefault"
)

// Config is the shared level's configuration.
type Config struct {
	Store Store
	// Name says which store it is, for the view and logs ("redis main").
	Name string
	// Prefix namespaces the keys: "<key_prefix>:diameter_agent:<agent>".
	Prefix string
	// Timeout bounds the one call made on a request's path, the read on a
	// local miss (default DefaultTimeout).
	Timeout time.Duration
	// Backlog bounds the writes waiting for the store (default
	// DefaultBacklog); one more is dropped and counted.
	Backlog int
	// DownFailures and DownAfter are the evidence a store must give before
	// it is marked down: DownFailures calls in a row without an answer,
	// the first at least DownAfter before the last. Recheck is how often a
	// down store is pinged. Defaults DefaultDownFailures, DefaultDownAfter,
	// DefaultRecheck.
	DownFailures int
	DownAfter    time.Duration
	Recheck      time.Duration
}

// Defaults of Config.
const (
	DefaultTimeout      = 50 * time.Millisecond
	DefaultBacklog      = 100_000
	DefaultDownFailures = 3
	DefaultDownAfter    = time.Second
	DefaultRecheck      = time.Second
	// batch is the most writes sent in one round trip.
	batch = 256
)

func (c *Config) setDefaults() {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Backlog <= 0 {
		c.Backlog = DefaultBacklog
	}
	if c.DownFailures <= 0 {
		c.DownFailures = DefaultDownFailures
	}
	if c.DownAfter <= 0 {
		c.DownAfter = DefaultDownAfter
	}
	if c.Recheck <= 0 {
		c.Recheck = DefaultRecheck
	}
}

// Adopt is called when a Claim found the key holding another server's
// identity: another replica bound the session first. The agent binds the
// session there from its next request (first writer wins) and returns
// true, or false if it cannot (the server is not in its peer table).
type Adopt func(sid, server string) bool

// Shared is the shared level of one agent's bindings.
type Shared struct {
	cfg   atomic.Pointer[Config]
	ttl   atomic.Int64 // ns
	log   *slog.Logger
	adopt Adopt

	health *storefault.Health
	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	queue   map[string]queued // by Session-Id
	sending int               // taken from the queue, not yet settled

	stats stats
}

// queued is a write waiting for the store; deferred says it waited
// through store trouble (its success is a reconciliation).
type queued struct {
	op       Op
	deferred bool
}

// New starts the shared level of bindings idle ttl; log may be nil.
func New(cfg Config, ttl time.Duration, log *slog.Logger, adopt Adopt) *Shared {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Shared{log: log, adopt: adopt, health: storefault.NewHealth(), wake: make(chan struct{}, 1), done: make(chan struct{}),
		queue: map[string]queued{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.Configure(cfg, ttl)
	go s.run()
	return s
}

// Configure applies a reload's configuration; the queue, the health and
// the counts stay.
func (s *Shared) Configure(cfg Config, ttl time.Duration) {
	cfg.setDefaults()
	s.cfg.Store(&cfg)
	s.ttl.Store(int64(max(ttl, time.Second)))
}

// Close stops the writer. Writes still queued are not made: the store
// keeps what it has, and the entries expire.
func (s *Shared) Close() {
	s.cancel()
	<-s.done
}

// Epoch is the renewal epoch at now: now ÷ (TTL/2), mod 4. The agent tags
// each local binding with the epoch it was last written to the store in;
// a hit on a binding tagged with another epoch renews the store's entry
// (a Claim, off the request's path) and retags it. So an entry in use on
// some replica is renewed at least every TTL/2 of use and never expires
// in the store while its session is in use; a binding idle for the three
// epochs a tag takes to come round again has expired locally (1.5 TTL).
func (s *Shared) Epoch(now time.Time) uint32 {
	half := max(s.ttl.Load()/2, int64(time.Second))
	return uint32(now.UnixNano()/half) & 3
}

// Healthy says whether the store is in use (not marked down).
func (s *Shared) Healthy() bool { return s.health.Healthy() }

// Lookup reads a Session-Id's binding from the store, waiting at most the
// configured timeout; ok is false on no entry, a malformed value, a
// failure or a store marked down (each counted).
func (s *Shared) Lookup(sid []byte) (server string, ok bool) {
	s.stats.lookups.Add(1)
	if !s.health.Healthy() {
		s.stats.skipped.Add(1)
		return "", false
	}
	cfg := s.cfg.Load()
	ctx, cancel := context.WithTimeout(s.ctx, cfg.Timeout)
	defer cancel()
	v, err := cfg.Store.Get(ctx, Key(cfg.Prefix, sid), time.Duration(s.ttl.Load()))
	switch {
	case err == nil && wellFormed(v):
		s.answered()
		s.stats.found.Add(1)
		return v, true
	case err == nil || errors.Is(err, ErrMalformed):
		s.answered()
		s.stats.malformed.Add(1)
	case errors.Is(err, ErrNotFound):
		s.answered()
		s.stats.notFound.Add(1)
	default:
		s.fail(err)
	}
	return "", false
}

// Stale counts a binding read from the store that names no server of the
// agent's peer table.
func (s *Shared) Stale() { s.stats.malformed.Add(1) }

// Claim queues the write of a new binding (or the renewal of one in use).
func (s *Shared) Claim(sid []byte, server string) { s.enqueue(sid, Claim, server) }

// Move queues the overwrite of a binding that moved to server.
func (s *Shared) Move(sid []byte, server string) { s.enqueue(sid, Move, server) }

// End queues the deletion of an ended session's binding.
func (s *Shared) End(sid []byte) { s.enqueue(sid, End, "") }

// enqueue puts a write in the queue, replacing one queued for the same
// session (the newer decision wins), and wakes the writer. A full queue
// drops the write (counted).
func (s *Shared) enqueue(sid []byte, kind Kind, server string) {
	healthy := s.health.Healthy()
	s.mu.Lock()
	q, there := s.queue[string(sid)]
	if !there && len(s.queue) >= s.cfg.Load().Backlog {
		s.mu.Unlock()
		s.stats.dropped.Add(1)
		return
	}
	if kind == Claim && there && q.op.Kind == Move {
		kind = Move // a renewal does not weaken a queued move
	}
	s.queue[string(sid)] = queued{op: Op{Kind: kind, Value: server}, deferred: q.deferred || !healthy}
	s.mu.Unlock()
	if healthy {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}
