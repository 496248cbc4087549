package ogs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Store is a second cache level shared by replicas (Redis, in the ogs
// plugin): one replica's probe run serves every replica. The local entries
// stay the first level: a fresh local entry answers without the store. The
// Selector reads the store only when a location has no fresh local entry,
// in the background flight that queries wait on (never longer than the
// answer deadline), and never fails a query because of it: any store error
// makes the replica probe locally, as without a store.
//
// Keys are the store's business (the plugin namespaces them by prefix and
// state name); values are opaque bytes that the Selector writes and
// validates like network input.
type Store interface {
	// Get returns location's value, or nil and no error when there is none.
	Get(ctx context.Context, location string) ([]byte, error)
	// Set stores location's value for ttl.
	Set(ctx context.Context, location string, value []byte, ttl time.Duration) error
	// Lock takes location's probe lock for ttl unless it is held (Redis:
	// SET NX PX), under token; it reports whether it took it.
	Lock(ctx context.Context, location, token string, ttl time.Duration) (bool, error)
	// Unlock releases location's lock if token still holds it.
	Unlock(ctx context.Context, location, token string) error
}

// ErrMalformed wraps a Store's error for a value that is there but cannot
// be one of the Selector's (Redis: a key of another type): the value is
// ignored and counted like one that does not parse, and the store is not
// considered down.
var ErrMalformed = errors.New("malformed value")

// Store defaults: one store call's bound, how often a replica waiting on
// another's probe run looks for its result, and how long the store is left
// alone after an error (the replica probes locally meanwhile).
const (
	DefaultStoreTimeout = 250 * time.Millisecond
	DefaultStorePoll    = 50 * time.Millisecond
	DefaultStoreRetry   = time.Second
)

// StoreEventKind is what happened with the store, for metrics and logs.
type StoreEventKind int

const (
	StoreError     StoreEventKind = iota // a store call failed (the replica probes locally)
	StoreMalformed                       // a value that does not parse or validate: ignored
	StoreStale                           // a value measured with another probe or other gateways: ignored
	StoreLockWait                        // another replica holds the probe lock: this one waits for its result
	StoreDown                            // the first error after the store worked (or at start)
	StoreUp                              // the first success after StoreDown
)

// StoreEvent is reported to Config.OnStore.
type StoreEvent struct {
	Kind     StoreEventKind
	Location string
	Err      error // StoreError, StoreMalformed, StoreDown: why
}

// storedEntry is a location's value in the store. Order and RTTs name
// gateways, never indices, and Probe and Gateways say what was measured, so
// a replica whose configuration differs recognises the value as stale.
type storedEntry struct {
	Version  int                `json:"v"`
	Probe    string             `json:"probe"`
	Gateways map[string]string  `json:"gateways"` // name → address
	At       time.Time          `json:"at"`
	Order    []string           `json:"order"`
	RTTs     map[string]float64 `json:"rtts_ms"` // measured gateways only
}

const storedVersion = 1

// maxStoredRTT bounds an RTT read from the store: no probe lasts an hour.
const maxStoredRTT = float64(time.Hour / time.Millisecond)

// encodeStored is res as stored, under cfg's probe.
func encodeStored(res *Result, cfg *Config) ([]byte, error) {
	v := storedEntry{Version: storedVersion, Probe: cfg.ProbeID, Gateways: map[string]string{}, At: res.At.UTC(), RTTs: map[string]float64{}}
	for _, g := range res.Gateways {
		v.Gateways[g.Name] = g.Addr
	}
	for _, i := range res.Order {
		v.Order = append(v.Order, res.Gateways[i].Name)
	}
	for i, rtt := range res.RTTs {
		if rtt > 0 {
			v.RTTs[res.Gateways[i].Name] = float64(rtt) / float64(time.Millisecond)
		}
	}
	return json.Marshal(v)
}

// errStale is decodeStored's error for a well-formed value measured with
// another probe or other gateways.
var errStale = errors.New("measured with another probe or other gateways")

// decodeStored validates a stored value against cfg and returns its result
// on cfg's gateways (the order recomputed by the rule, with cfg's backups).
// A value that does not parse, names a gateway it does not list, has an RTT
// that is not a positive number of milliseconds below an hour, or a time in
// the future is malformed; one listing other gateways or addresses, or
// another probe, is errStale.
func decodeStored(data []byte, cfg *Config, now time.Time) (*Result, error) {
	var v storedEntry
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	switch {
	case v.Version != storedVersion:
		return nil, fmt.Errorf("version %d, want %d", v.Version, storedVersion)
	case v.At.IsZero() || v.At.After(now.Add(time.Minute)):
		return nil, fmt.Errorf("time %v: missing or in the future", v.At)
	case len(v.Gateways) == 0:
		return nil, errors.New("no gateways")
	case len(v.RTTs) == 0:
		return nil, errors.New("no measured gateway")
	}
	for name, ms := range v.RTTs {
		if _, ok := v.Gateways[name]; !ok {
			return nil, fmt.Errorf("RTT of unknown gateway %q", name)
		}
		if math.IsNaN(ms) || ms <= 0 || ms > maxStoredRTT {
			return nil, fmt.Errorf("gateway %q: RTT %v ms out of range", name, ms)
		}
	}
	seen := map[string]bool{}
	for _, name := range v.Order {
		if _, ok := v.Gateways[name]; !ok || seen[name] {
			return nil, fmt.Errorf("order: unknown or repeated gateway %q", name)
		}
		seen[name] = true
	}
	if v.Probe != cfg.ProbeID || len(v.Gateways) != len(cfg.Gateways) {
		return nil, errStale
	}
	rtts := make([]time.Duration, len(cfg.Gateways))
	for i, g := range cfg.Gateways {
		if v.Gateways[g.Name] != g.Addr {
			return nil, errStale
		}
		rtts[i] = time.Duration(v.RTTs[g.Name] * float64(time.Millisecond))
	}
	return &Result{Gateways: cfg.Gateways, Order: Order(cfg.Gateways, rtts, cfg.OmitUnmeasured), RTTs: rtts, At: v.At}, nil
}

// storeCtx bounds one store call.
func (s *Selector) storeCtx(cfg *Config) (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, cfg.StoreTimeout)
}

// storeUsable reports whether the store is configured and not resting
// after an error.
func (s *Selector) storeUsable(cfg *Config) bool {
	if cfg.Store == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.now().Before(s.storeDownUntil)
}

// storeDone records a store call's outcome: an error rests the store for
// StoreRetry (the replica goes on locally) and is reported, the first one
// after a success also as StoreDown; the first success after that as
// StoreUp.
func (s *Selector) storeDone(cfg *Config, location string, err error) {
	if s.ctx.Err() != nil {
		return // shutting down: not the store's fault
	}
	s.mu.Lock()
	var events []StoreEvent
	if err != nil {
		events = append(events, StoreEvent{Kind: StoreError, Location: location, Err: err})
		if !s.storeDown {
			events = append(events, StoreEvent{Kind: StoreDown, Location: location, Err: err})
		}
		s.storeDown, s.storeDownUntil = true, s.now().Add(cfg.StoreRetry)
	} else if s.storeDown {
		s.storeDown = false
		events = append(events, StoreEvent{Kind: StoreUp, Location: location})
	}
	s.mu.Unlock()
	s.report(cfg, events...)
}

func (s *Selector) report(cfg *Config, events ...StoreEvent) {
	if cfg.OnStore == nil {
		return
	}
	for _, ev := range events {
		cfg.OnStore(ev)
	}
}

// StoreHealthy reports whether the store answered its last call (true
// before the first call); false without a store.
func (s *Selector) StoreHealthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Store != nil && !s.storeDown
}

// fetchOrRun is the flight of a location with no fresh local entry when a
// store is configured: the store's fresh value answers; else this replica
// takes the location's probe lock (for the run's deadline) and probes,
// writing the result for the others; else another replica is probing, and
// this one polls the store for its result (queries wait on the flight up to
// the answer deadline, as for a local run, and then fall back). Once the
// other's lock would have expired, or on any store error, it probes
// locally.
func (s *Selector) fetchOrRun(location string, e *entry, done chan struct{}, cfg Config, epoch uint64) {
	defer s.wg.Done()
	if !s.storeUsable(&cfg) {
		s.run(location, e, done, cfg, epoch, "")
		return
	}
	token := newToken()
	giveUp := time.Now().Add(cfg.Deadline + 2*cfg.StoreTimeout)
	waited, counted := false, false
	for {
		ctx, cancel := s.storeCtx(&cfg)
		data, err := cfg.Store.Get(ctx, location)
		cancel()
		malformed := errors.Is(err, ErrMalformed)
		if malformed {
			err = nil
		}
		s.storeDone(&cfg, location, err)
		if err != nil {
			break
		}
		if malformed && !counted {
			counted = true
			s.report(&cfg, StoreEvent{Kind: StoreMalformed, Location: location, Err: ErrMalformed})
		}
		if data != nil {
			res, err := decodeStored(data, &cfg, s.now())
			switch {
			case err == nil && s.now().Sub(res.At) < cfg.CacheTTL:
				if s.adopt(e, done, res, epoch) {
					return
				}
			case err == nil: // expired here (a shorter cache_ttl): probe anew
			case counted:
			case errors.Is(err, errStale):
				counted = true
				s.report(&cfg, StoreEvent{Kind: StoreStale, Location: location, Err: err})
			default:
				counted = true
				s.report(&cfg, StoreEvent{Kind: StoreMalformed, Location: location, Err: err})
			}
		}
		ctx, cancel = s.storeCtx(&cfg)
		got, err := cfg.Store.Lock(ctx, location, token, cfg.Deadline)
		cancel()
		s.storeDone(&cfg, location, err)
		if err != nil {
			break
		}
		if got {
			s.run(location, e, done, cfg, epoch, token)
			return
		}
		if !waited {
			waited = true
			s.report(&cfg, StoreEvent{Kind: StoreLockWait, Location: location})
		}
		if time.Now().After(giveUp) {
			break // the holder's lock should have expired by now
		}
		if !sleep(s.ctx, cfg.StorePoll) {
			s.abandon(e, done)
			return
		}
	}
	s.run(location, e, done, cfg, epoch, "")
}

// adopt installs a result read from the store as e's, ending the flight
// done; it reports false when a reload invalidated the measurements since
// the flight began (the flight then goes on).
func (s *Selector) adopt(e *entry, done chan struct{}, res *Result, epoch uint64) bool {
	s.mu.Lock()
	if epoch != s.epoch {
		s.mu.Unlock()
		return false
	}
	if !sameGateways(res.Gateways, s.cfg.Gateways) {
		if res = s.remap(res); res == nil {
			s.mu.Unlock()
			return false
		}
	}
	e.res, e.epoch, e.failed, e.shared = res, epoch, nil, true
	e.flight, e.progress = nil, nil
	s.mu.Unlock()
	close(done)
	s.requestSave()
	return true
}

// abandon ends a flight without a result (the selector is closing).
func (s *Selector) abandon(e *entry, done chan struct{}) {
	s.mu.Lock()
	e.flight, e.progress = nil, nil
	s.mu.Unlock()
	close(done)
}

// share writes a run's result to the store (when it is usable) for the
// other replicas, with the rest of its lifetime as TTL, and releases the
// location's probe lock if this run held it.
func (s *Selector) share(location string, res *Result, cfg Config, token string) {
	if cfg.Store == nil || (token == "" && !s.storeUsable(&cfg)) {
		return
	}
	if res != nil {
		if ttl := cfg.CacheTTL - s.now().Sub(res.At); ttl >= time.Millisecond {
			data, err := encodeStored(res, &cfg)
			if err == nil {
				ctx, cancel := s.storeCtx(&cfg)
				err = cfg.Store.Set(ctx, location, data, ttl)
				cancel()
				s.storeDone(&cfg, location, err)
			}
		}
	}
	if token != "" {
		ctx, cancel := s.storeCtx(&cfg)
		err := cfg.Store.Unlock(ctx, location, token)
		cancel()
		s.storeDone(&cfg, location, err)
	}
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
