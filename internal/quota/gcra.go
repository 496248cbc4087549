package quota

import (
	"sync/atomic"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// limiter is one peer's GCRA at its share: internal/ratelimit's Bucket under
// a Rule made for the share. When the share changes, the debt is rescaled
// (Bucket.Rescale) so that the admissions outstanding stay the same. Without
// it, a debt run up at a floor share of 1/s keeps a replica from admitting
// for up to a second after its share rises to 10/s; in the 100-replica
// simulation that alone cost 16 % of the limit.
type limiter struct {
	bucket ratelimit.Bucket
	rule   atomic.Pointer[ratelimit.Rule] // nil: a share of 0, admit nothing
}

// shareRule is the rule for a share of rate with burst (0: the default);
// nil for a share of 0.
func shareRule(rate float64, burst int) *ratelimit.Rule {
	r, err := ratelimit.NewRule("share", rate, burst)
	if err != nil {
		return nil // rate ≤ 0: admit nothing
	}
	return r
}

func (l *limiter) allow(now int64) bool {
	r := l.rule.Load()
	return r != nil && l.bucket.Allow(r, now)
}

// set changes the share at now, rescaling the debt.
func (l *limiter) set(r *ratelimit.Rule, now int64) {
	old := l.rule.Swap(r)
	if old != nil && r != nil {
		l.bucket.Rescale(old.Rate/r.Rate, now)
	}
}

func (l *limiter) full(now int64) bool { return l.bucket.Full(now) }
