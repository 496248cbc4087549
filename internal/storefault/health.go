package storefault

import (
	"sync"
	"sync/atomic"
	"time"
)

// Health is the rule that marks a shared store down and up again, for an
// engine whose calls to it run off the request's path: DownFailures calls
// in a row without an answer, the first at least DownAfter before the last
// (one slow answer on a busy host is not a down store); an error reply
// never marks it down. Each transition is reported once, so the caller
// logs it once.
type Health struct {
	healthy atomic.Bool
	downs   atomic.Int64
	failing atomic.Int32 // mirrors streak, read without the lock

	mu         sync.Mutex
	streak     int // calls in a row without an answer
	since      time.Time
	downSince  time.Time
	lastError  string
	lastReason string
	errorAt    time.Time
}

// NewHealth returns the health of a store in use.
func NewHealth() *Health {
	h := &Health{}
	h.healthy.Store(true)
	return h
}

// Healthy says whether the store is in use (not marked down).
func (h *Health) Healthy() bool { return h.healthy.Load() }

// Answered ends a run of calls without an answer: one atomic load while
// there is none, so a caller may note every answered call.
func (h *Health) Answered() {
	if h.failing.Load() == 0 {
		return
	}
	h.mu.Lock()
	h.streak = 0
	h.failing.Store(0)
	h.mu.Unlock()
}

// Note records a failed call that does not count toward marking the store
// down (a ping of a store already down) and returns its reason word.
func (h *Health) Note(err error, now time.Time) string {
	reason, _ := Read(err)
	h.mu.Lock()
	h.lastError, h.lastReason, h.errorAt = err.Error(), reason, now
	h.mu.Unlock()
	return reason
}

// Fail records a failed call at now and returns its reason word; down
// says this call marked the store down.
func (h *Health) Fail(err error, now time.Time, failures int, after time.Duration) (reason string, down bool) {
	reason, answered := Read(err)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastError, h.lastReason, h.errorAt = err.Error(), reason, now
	if answered {
		return reason, false
	}
	if h.streak == 0 {
		h.since = now
	}
	h.streak++
	h.failing.Store(int32(min(h.streak, 1<<30)))
	if h.streak >= failures && now.Sub(h.since) >= after && h.healthy.CompareAndSwap(true, false) {
		h.downSince = now
		h.downs.Add(1)
		return reason, true
	}
	return reason, false
}

// Back marks a down store in use again (it answered); it returns how long
// it was down, or false if it was not down.
func (h *Health) Back(now time.Time) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.streak = 0
	h.failing.Store(0)
	if !h.healthy.CompareAndSwap(false, true) {
		return 0, false
	}
	return now.Sub(h.downSince), true
}

// HealthView is a store's health for an admin view.
type HealthView struct {
	Healthy    bool      `json:"healthy"`
	DownSince  time.Time `json:"down_since,omitzero"`
	LastError  string    `json:"last_error,omitempty"`
	LastReason string    `json:"last_reason,omitempty"`
	ErrorAt    time.Time `json:"error_at,omitzero"`
	Downs      int64     `json:"downs"` // times marked down
}

// View returns the health now.
func (h *Health) View() HealthView {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := HealthView{Healthy: h.healthy.Load(), LastError: h.lastError, LastReason: h.lastReason, ErrorAt: h.errorAt,
		Downs: h.downs.Load()}
	if !v.Healthy {
		v.DownSince = h.downSince
	}
	return v
}
