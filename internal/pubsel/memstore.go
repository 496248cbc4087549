package pubsel

import (
	"context"
	"errors"
	"sync"
	"time"
)

// MemStore is an in-memory Store with Redis' semantics for the calls the
// shared level makes (expiry, SET NX, GETEX renewing the expiry, a key of
// another type), and switches to make it fail or hang: the fake for unit
// tests of the engine and the adapters.
type MemStore struct {
	mu      sync.Mutex
	now     func() time.Time
	entries map[string]memEntry
	down    bool // every call fails at once
	hang    bool // every call waits for its context
	calls   int
}

type memEntry struct {
	value   string
	other   bool // a key of another type (a hash, a list…)
	expires time.Time
}

// NewMemStore returns an empty store on the real clock.
func NewMemStore() *MemStore { return &MemStore{now: time.Now, entries: map[string]memEntry{}} }

// SetNow replaces the store's clock (for expiry).
func (m *MemStore) SetNow(now func() time.Time) { m.mu.Lock(); m.now = now; m.mu.Unlock() }

// Flush forgets every key, as a Redis restarted without persistence.
func (m *MemStore) Flush() { m.mu.Lock(); clear(m.entries); m.mu.Unlock() }

// ErrMemDown is what a MemStore set down answers.
var ErrMemDown = errors.New("memstore: connection refused")

// SetDown makes every call fail at once (true) or work again.
func (m *MemStore) SetDown(down bool) { m.mu.Lock(); m.down = down; m.mu.Unlock() }

// SetHang makes every call wait until its context ends (true), as a store
// that accepts connections but does not answer.
func (m *MemStore) SetHang(hang bool) { m.mu.Lock(); m.hang = hang; m.mu.Unlock() }

// Calls returns how many calls were made, failed ones included.
func (m *MemStore) Calls() int { m.mu.Lock(); defer m.mu.Unlock(); return m.calls }

// Put sets a raw string value (as another program or replica would).
func (m *MemStore) Put(key, value string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[key] = memEntry{value: value}
}

// PutOther makes key hold a value of another type.
func (m *MemStore) PutOther(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[key] = memEntry{other: true}
}

// Value returns key's string value, if it has a live one.
func (m *MemStore) Value(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.live(key)
	return e.value, ok && !e.other
}

// Len returns the number of live keys.
func (m *MemStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k := range m.entries {
		if _, ok := m.live(k); ok {
			n++
		}
	}
	return n
}

func (m *MemStore) live(key string) (memEntry, bool) {
	e, ok := m.entries[key]
	if ok && !e.expires.IsZero() && !m.now().Before(e.expires) {
		delete(m.entries, key)
		return memEntry{}, false
	}
	return e, ok
}

// enter counts a call and applies the failure switches.
func (m *MemStore) enter(ctx context.Context) error {
	m.mu.Lock()
	m.calls++
	down, hang := m.down, m.hang
	m.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if down {
		return ErrMemDown
	}
	return nil
}

func (m *MemStore) expiry(ttl time.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return m.now().Add(ttl)
}

// Get is GETEX key PX ttl.
func (m *MemStore) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := m.enter(ctx); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.live(key)
	switch {
	case !ok:
		return "", ErrNotFound
	case e.other:
		return "", ErrWrongType
	}
	e.expires = m.expiry(ttl)
	m.entries[key] = e
	return e.value, nil
}

// SetNX is SET key value NX PX ttl.
func (m *MemStore) SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	if err := m.enter(ctx); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.live(key); ok {
		return false, nil
	}
	m.entries[key] = memEntry{value: value, expires: m.expiry(ttl)}
	return true, nil
}

// Set is SET key value PX ttl.
func (m *MemStore) Set(ctx context.Context, key, value string, ttl time.Duration) error {
	if err := m.enter(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[key] = memEntry{value: value, expires: m.expiry(ttl)}
	return nil
}

// Ping answers unless the store is down or hangs.
func (m *MemStore) Ping(ctx context.Context) error { return m.enter(ctx) }
