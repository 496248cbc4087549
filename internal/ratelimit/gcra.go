// Package ratelimit is the peer rate limiter of Cisco vDRA: static limits
// per peer and per message type (GCRA, one atomic word per key), bounded
// per-key tables, and the dynamic controller that throttles limits from a
// backend's load with a threshold table, a reversal hold time and a
// reversal step. It knows nothing of Caddy or Diameter.
package ratelimit

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Rule is a rate limit: Rate per second with bursts of up to Burst. Its
// effective rate can be lowered at run time (Throttle) without touching
// the buckets that use it.
type Rule struct {
	Name  string
	Rate  float64 // configured requests per second
	Burst int

	// defaultBurst: Burst was not configured but is DefaultBurst(Rate).
	defaultBurst bool

	// Derived from the effective rate; read on every decision.
	interval  atomic.Int64 // ns between admissions (GCRA emission interval)
	tolerance atomic.Int64 // ns of burst tolerance
	throttle  atomic.Int64 // percent of Rate withheld (dynamic throttling)
	burst     atomic.Int64 // the burst at the effective rate
}

// DefaultBurst is 1/20 s of traffic plus one request: 1 + ⌈rate/20⌉, so at
// least 2. Its tolerance — how early a request may come, (burst − 1)
// intervals — is then at least 50 ms and at least one interval. Both floors
// matter at low rates: with a burst of 1 the tolerance is zero, so a client
// paced at the limit loses every request that scheduling jitter brings a
// little early, and a client offering a little more than the limit is
// admitted at about half of it (each refused request wastes the interval
// until the next one). With them, such clients are admitted at the limit.
// Over any 10 s the admitted count exceeds the rate by at most 0.5 % plus
// two requests.
func DefaultBurst(rate float64) int { return 1 + int(math.Ceil(rate/20)) }

// NewRule returns a rule; burst 0 means DefaultBurst.
func NewRule(name string, rate float64, burst int) (*Rule, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("rate %v: must be a positive number per second", rate)
	}
	if burst < 0 {
		return nil, fmt.Errorf("burst %d: must not be negative", burst)
	}
	r := &Rule{Name: name, Rate: rate, Burst: burst}
	if burst == 0 {
		r.Burst, r.defaultBurst = DefaultBurst(rate), true
	}
	r.SetThrottle(0)
	return r, nil
}

// SetThrottle withholds pct percent (0–100) of the rule's rate. The burst
// follows the effective rate (see BurstAt), so a throttled limit overshoots
// no more, in proportion, than an unthrottled one.
func (r *Rule) SetThrottle(pct int) {
	pct = min(max(pct, 0), 100)
	r.throttle.Store(int64(pct))
	eff := r.Rate * float64(100-pct) / 100
	if eff <= 0 {
		r.interval.Store(never)
		r.tolerance.Store(0)
		r.burst.Store(0)
		return
	}
	iv := int64(float64(time.Second) / eff)
	b := r.BurstAt(eff)
	r.interval.Store(iv)
	r.tolerance.Store(iv * int64(b-1))
	r.burst.Store(int64(b))
}

// BurstAt is the burst at an effective rate eff: the default burst is the
// default at eff (⌈eff/20⌉ + 1); a configured burst is the same span of
// traffic at eff as at the configured rate, ⌈burst × eff/rate⌉, but never
// fewer than 2 requests unless 1 was configured (a burst of 1 refuses
// every request that comes a little early).
func (r *Rule) BurstAt(eff float64) int {
	if r.defaultBurst {
		return DefaultBurst(eff)
	}
	return max(min(r.Burst, 2), int(math.Ceil(float64(r.Burst)*eff/r.Rate)))
}

// EffectiveBurst returns the burst in force (0 when throttled to zero).
func (r *Rule) EffectiveBurst() int { return int(r.burst.Load()) }

// Throttle returns the percent withheld.
func (r *Rule) Throttle() int { return int(r.throttle.Load()) }

// Effective returns the rate in force.
func (r *Rule) Effective() float64 { return r.Rate * float64(100-r.Throttle()) / 100 }

// never is the interval of a rule throttled to zero: it admits nothing.
const never = math.MaxInt64 / 4

// Bucket is one key's GCRA state: the theoretical arrival time of the next
// admission, in unix nanoseconds.
type Bucket struct {
	tat atomic.Int64
}

// Allow admits one event at now under rule r, or refuses it.
//
// The bucket's state is an absolute time, not a count under some rule: the
// peer's debt is tat − now, whatever rule ran it up. So a bucket may go on
// under a changed rule (a dynamic throttle, or a reload that changes the
// rate or burst) with nothing converted: the debt is kept, and the new rule
// admits again once the debt is at most its tolerance, (burst − 1) × its
// interval, then at its rate.
func (b *Bucket) Allow(r *Rule, now int64) bool {
	interval, tolerance := r.interval.Load(), r.tolerance.Load()
	if interval == never {
		return false
	}
	for {
		old := b.tat.Load()
		tat := max(old, now)
		if tat-now > tolerance {
			return false
		}
		if b.tat.CompareAndSwap(old, tat+interval) {
			return true
		}
	}
}

// Refund gives back one admission made under r, for a decision that a
// later check refused.
func (b *Bucket) Refund(r *Rule) {
	b.tat.Add(-r.interval.Load())
}

// Rescale multiplies the bucket's debt at now (tat − now) by factor, so that
// the admissions it has outstanding stay the same when its rule's interval
// changes by that factor (old rate / new rate).
func (b *Bucket) Rescale(factor float64, now int64) {
	for {
		old := b.tat.Load()
		if old <= now || b.tat.CompareAndSwap(old, now+int64(float64(old-now)*factor)) {
			return
		}
	}
}

// Full reports whether the bucket has refilled (no debt at now), so that
// dropping it loses nothing.
func (b *Bucket) Full(now int64) bool {
	return b.tat.Load() <= now
}
