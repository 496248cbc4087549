package quota

import (
	"math"
	"sync/atomic"
	"time"
)

// limiter is one peer's GCRA at its share, as internal/ratelimit's Bucket
// and Rule (same admission rule and burst floor of 2), with one difference
// that shares need: when the rate changes, the debt (tat − now) is rescaled
// so that the admissions outstanding stay the same. Without it, a debt run
// up at a floor share of 1/s keeps a replica from admitting for up to a
// second after its share rises to 10/s; in the 100-replica simulation that
// alone cost 16 % of the limit.
type limiter struct {
	tat    atomic.Int64 // unix ns: theoretical arrival time of the next admission
	params atomic.Pointer[gcraParams]
}

type gcraParams struct {
	rate                float64
	interval, tolerance int64 // ns; interval == never: admit nothing
}

const never = math.MaxInt64 / 4

func newParams(rate float64, burst int) *gcraParams {
	if !(rate > 0) {
		return &gcraParams{interval: never}
	}
	iv := int64(float64(time.Second) / rate)
	return &gcraParams{rate: rate, interval: iv, tolerance: iv * int64(burst-1)}
}

func (l *limiter) allow(now int64) bool {
	p := l.params.Load()
	if p.interval == never {
		return false
	}
	for {
		old := l.tat.Load()
		tat := max(old, now)
		if tat-now > p.tolerance {
			return false
		}
		if l.tat.CompareAndSwap(old, tat+p.interval) {
			return true
		}
	}
}

// set changes the rate at now, rescaling the debt.
func (l *limiter) set(p *gcraParams, now int64) {
	old := l.params.Swap(p)
	if old == nil || old.interval == never || p.interval == never {
		return
	}
	factor := float64(p.interval) / float64(old.interval)
	for {
		tat := l.tat.Load()
		if tat <= now || l.tat.CompareAndSwap(tat, now+int64(float64(tat-now)*factor)) {
			return
		}
	}
}

func (l *limiter) full(now int64) bool { return l.tat.Load() <= now }
