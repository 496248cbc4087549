package orca

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Tracker keeps the reports of up to a fixed number of upstreams, by a key
// the caller chooses (the upstream's dial address). Reading and reporting
// for a known upstream take no lock: the map is replaced, never changed,
// behind an atomic pointer, and only a new upstream takes the lock and
// copies it. That suits a set of upstreams that changes with the config,
// not per request; the bound keeps a key that somehow comes from clients
// from growing it.
type Tracker struct {
	blackout   atomic.Int64
	expiration atomic.Int64
	max        int

	mu sync.Mutex // orders writers of m
	m  atomic.Pointer[map[string]*Upstream]
}

// NewTracker returns a tracker of at most maxUpstreams upstreams.
func NewTracker(p Periods, maxUpstreams int) (*Tracker, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	if maxUpstreams < 1 {
		return nil, fmt.Errorf("max upstreams %d: must be at least 1", maxUpstreams)
	}
	t := &Tracker{max: maxUpstreams}
	t.SetPeriods(p)
	m := map[string]*Upstream{}
	t.m.Store(&m)
	return t, nil
}

// SetPeriods applies a reload's periods to the reports kept.
func (t *Tracker) SetPeriods(p Periods) {
	t.blackout.Store(int64(p.Blackout))
	t.expiration.Store(int64(p.Expiration))
}

// Periods returns the periods in force.
func (t *Tracker) Periods() Periods {
	return Periods{Blackout: time.Duration(t.blackout.Load()), Expiration: time.Duration(t.expiration.Load())}
}

// Get returns key's upstream, or nil.
func (t *Tracker) Get(key string) *Upstream { return (*t.m.Load())[key] }

// Observe records r for key, received at now, adding key if it is new.
// When the table is full it first forgets the upstreams whose last report
// (or, for one that never reported, whose addition) is older than the
// expiration period; if none is, the report is refused (ReasonTableFull).
func (t *Tracker) Observe(key string, r *Report, now int64) Reason {
	util, ok := r.Utilization()
	if !ok {
		return ReasonNoUtilization // before the insert: a silent key takes no room
	}
	return t.observe(key, util, r, now)
}

// ObserveCPU is Observe for a caller that weighs each upstream by its
// cpu_utilization alone (peer_rate_limit's throttle follows the backends'
// CPU, as a CPU exporter would give it): a report without cpu_utilization
// is not a report for it (ReasonNoUtilization) and changes nothing, even
// when it carries application_utilization.
func (t *Tracker) ObserveCPU(key string, r *Report, now int64) Reason {
	if r.Has&FieldCPU == 0 {
		return ReasonNoUtilization
	}
	return t.observe(key, r.CPUUtilization, r, now)
}

func (t *Tracker) observe(key string, util float64, r *Report, now int64) Reason {
	u := t.Get(key)
	if u == nil {
		if u = t.add(key, now); u == nil {
			return ReasonTableFull
		}
	}
	u.observe(util, r, now, t.Periods())
	return ReasonOK
}

func (t *Tracker) add(key string, now int64) *Upstream {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.m.Load()
	if u := old[key]; u != nil {
		return u // added meanwhile
	}
	exp := t.expiration.Load()
	m := make(map[string]*Upstream, len(old)+1)
	for k, u := range old {
		if len(old) >= t.max && now-max(u.last.Load(), u.added) >= exp {
			continue
		}
		m[k] = u
	}
	if len(m) >= t.max {
		return nil
	}
	// The key may be a substring of a large buffer (a header): keep a copy.
	u := &Upstream{added: now}
	m[strings.Clone(key)] = u
	t.m.Store(&m)
	return u
}

// Len is the number of upstreams kept.
func (t *Tracker) Len() int { return len(*t.m.Load()) }

// Each calls fn for every upstream, in no order, for an admin view.
func (t *Tracker) Each(fn func(key string, u *Upstream)) {
	for k, u := range *t.m.Load() {
		fn(k, u)
	}
}

// Aggregate says how Load combines the fresh upstreams.
type Aggregate uint8

const (
	AggregateMax  Aggregate = iota // the busiest backend: protect the first to saturate
	AggregateMean                  // the pool's average
)

// ParseAggregate reads "max" or "mean".
func ParseAggregate(s string) (Aggregate, error) {
	switch s {
	case "max", "":
		return AggregateMax, nil
	case "mean":
		return AggregateMean, nil
	}
	return 0, fmt.Errorf("aggregate %q: want max or mean", s)
}

func (a Aggregate) String() string {
	if a == AggregateMean {
		return "mean"
	}
	return "max"
}

// Load combines the utilizations of the upstreams whose report is fresh
// at now, and says how many there were (0: none, load is then 0).
func (t *Tracker) Load(now int64, agg Aggregate) (load float64, fresh int) {
	p := t.Periods()
	for _, u := range *t.m.Load() {
		util, _, st := u.Utilization(now, p)
		if st != StateFresh {
			continue
		}
		fresh++
		if agg == AggregateMean {
			load += util
		} else {
			load = max(load, util)
		}
	}
	if agg == AggregateMean && fresh > 0 {
		load /= float64(fresh)
	}
	return load, fresh
}

// ErrNoFreshReport is Source.Read's error when no upstream has a fresh
// report: the dynamic limiter then keeps its throttle level, as for any
// unreadable source.
var ErrNoFreshReport = errors.New("no upstream has a fresh ORCA report")

// Source reads a tracker's load in percent, with the shape of
// internal/loadsource.Source, so peer_rate_limit's dynamic throttle can be
// driven by the backends' own reports instead of a poll.
type Source struct {
	Tracker   *Tracker
	Aggregate Aggregate
	Clock     func() int64 // the clock the reports were observed on, ns
}

// Read returns the aggregate utilization × 100, capped at 100: ORCA lets
// utilization exceed 1 past a backend's soft limit, and a throttle table
// ends at 100 %.
func (s *Source) Read(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", s, err)
	}
	load, n := s.Tracker.Load(s.Clock(), s.Aggregate)
	if n == 0 {
		return 0, fmt.Errorf("%s: %w", s, ErrNoFreshReport)
	}
	return min(load*100, 100), nil
}

func (s *Source) String() string {
	return "orca " + Header + " (" + s.Aggregate.String() + " of fresh upstream reports)"
}
