package ogs

import (
	"hash/maphash"
	"time"

	"golang.org/x/time/rate"

	"github.com/edgesteer/edgesteer/internal/bounded"
)

// ReportLimiter bounds the reports accepted per key (a token id, a source
// address): a token bucket each, in a bounded table (a key pushed out
// starts again with a full bucket, so the bound keeps memory, not rate, for
// the keys beyond it).
type ReportLimiter struct {
	limit rate.Limit
	burst int
	table *bounded.Table[*rate.Limiter]
	seed  maphash.Seed
}

// NewReportLimiter allows perSecond reports a key, burst at once, for at
// most maxKeys keys.
func NewReportLimiter(perSecond float64, burst, maxKeys int) *ReportLimiter {
	l := &ReportLimiter{limit: rate.Limit(perSecond), burst: burst, table: bounded.New[*rate.Limiter](maxKeys), seed: maphash.MakeSeed()}
	l.table.SetLimits(maxKeys, 3600)
	return l
}

// Allow takes one report from key's bucket.
func (l *ReportLimiter) Allow(key string, now time.Time) bool {
	h := maphash.String(l.seed, key)
	lim := l.table.GetOrPut(h, uint32(now.Unix()), func() *rate.Limiter { return rate.NewLimiter(l.limit, l.burst) })
	return lim.AllowN(now, 1)
}

// Len returns the keys held.
func (l *ReportLimiter) Len() int { return l.table.Len() }
