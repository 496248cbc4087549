package orca

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// A58's defaults: a report is used 10 s after an endpoint starts reporting,
// and forgotten 3 min after it was received.
const (
	DefaultBlackout   = 10 * time.Second
	DefaultExpiration = 3 * time.Minute
)

// Periods are A58's two periods.
//   - Blackout: a report is not used until the endpoint has reported
//     without a break for this long, so that one early report from a
//     backend still warming up (or just restarted) does not steer traffic.
//     0 uses reports at once.
//   - Expiration: a report older than this is forgotten, and the next one
//     starts a new blackout. A break in reporting longer than Expiration
//     is what ends a run.
type Periods struct {
	Blackout   time.Duration
	Expiration time.Duration
}

// DefaultPeriods are A58's.
var DefaultPeriods = Periods{Blackout: DefaultBlackout, Expiration: DefaultExpiration}

// Check names the bad period, for the adapter's load-time error.
func (p Periods) Check() error {
	if p.Blackout < 0 {
		return fmt.Errorf("blackout %v: must not be negative", p.Blackout)
	}
	if p.Expiration <= 0 {
		return fmt.Errorf("expiration %v: must be positive", p.Expiration)
	}
	return nil
}

// State is where an upstream's report stands.
type State uint8

const (
	StateNone     State = iota // no report yet
	StateBlackout              // reporting for less than the blackout period
	StateFresh                 // usable
	StateExpired               // the last report is older than the expiration period
)

func (s State) String() string {
	return [...]string{"none", "blackout", "fresh", "expired"}[s]
}

// Upstream is one backend's latest report. The zero value is ready; it
// must not be copied after first use. Observe and every read may run
// concurrently: each figure is one atomic word, so a reader may pair one
// report's utilization with the next one's mem_utilization, never a torn
// number. Times are nanoseconds on a clock the owner keeps to (positive;
// 0 means never).
type Upstream struct {
	since atomic.Int64 // first report of the current run
	last  atomic.Int64 // latest report with a utilization
	util  atomic.Uint64
	cpu   atomic.Uint64
	app   atomic.Uint64
	mem   atomic.Uint64
	rps   atomic.Uint64
	eps   atomic.Uint64
	added int64 // Tracker: when the entry was made (set before it is shared)
}

// Observe records r, received at now, and says why it did not: a report
// with neither cpu_utilization nor application_utilization is not a
// report for A58 (ReasonNoUtilization) and changes nothing.
//
// Unlike gRPC, which only sees protos, an explicit 0 in the TEXT and JSON
// forms counts: an idle backend that says so is fresh, not silent.
func (u *Upstream) Observe(r *Report, now int64, p Periods) Reason {
	util, ok := r.Utilization()
	if !ok {
		return ReasonNoUtilization
	}
	u.observe(util, r, now, p)
	return ReasonOK
}

// observe records r with util as the utilization it is weighed by.
func (u *Upstream) observe(util float64, r *Report, now int64, p Periods) {
	// since is written before last, and readers load last first, so a
	// reader that sees the new report also sees the run it began.
	if prev := u.last.Load(); prev == 0 || now-prev >= int64(p.Expiration) {
		u.since.Store(now)
	}
	u.cpu.Store(math.Float64bits(r.CPUUtilization))
	u.app.Store(math.Float64bits(r.ApplicationUtilization))
	u.mem.Store(math.Float64bits(r.MemUtilization))
	u.rps.Store(math.Float64bits(r.RPSFractional))
	u.eps.Store(math.Float64bits(r.EPS))
	u.util.Store(math.Float64bits(util))
	u.last.Store(now)
}

// Utilization returns, at now, the utilization A58 weighs by
// (application_utilization when above zero, else cpu_utilization) of the
// latest report, its age, and its state; util is meaningful only when st
// is StateFresh, which the cost of a pick should require. Reading writes
// nothing: it is three atomic loads.
func (u *Upstream) Utilization(now int64, p Periods) (util float64, age time.Duration, st State) {
	last := u.last.Load()
	if last == 0 {
		return 0, 0, StateNone
	}
	since := u.since.Load()
	util = math.Float64frombits(u.util.Load())
	age = time.Duration(max(now-last, 0))
	switch {
	case age >= p.Expiration:
		return util, age, StateExpired
	case now-since < int64(p.Blackout):
		return util, age, StateBlackout
	}
	return util, age, StateFresh
}

// Fresh reports whether Utilization's state at now would be StateFresh,
// with two atomic loads and no arithmetic on the figures: for a pick's hot
// path, which then reads a factor it derived from the report itself.
func (u *Upstream) Fresh(now int64, p Periods) bool {
	last := u.last.Load()
	return last != 0 && now-last < int64(p.Expiration) && now-u.since.Load() >= int64(p.Blackout)
}

// Snapshot is the latest report's standard fields, for an admin view.
type Snapshot struct {
	Utilization            float64
	CPUUtilization         float64
	ApplicationUtilization float64
	MemUtilization         float64
	RPSFractional          float64
	EPS                    float64
	Age                    time.Duration
	ReportingFor           time.Duration // since the current run began
	State                  State
}

// Snapshot reads every figure at now.
func (u *Upstream) Snapshot(now int64, p Periods) Snapshot {
	util, age, st := u.Utilization(now, p)
	s := Snapshot{Utilization: util, Age: age, State: st}
	if st == StateNone {
		return s
	}
	f := func(a *atomic.Uint64) float64 { return math.Float64frombits(a.Load()) }
	s.CPUUtilization, s.ApplicationUtilization = f(&u.cpu), f(&u.app)
	s.MemUtilization, s.RPSFractional, s.EPS = f(&u.mem), f(&u.rps), f(&u.eps)
	s.ReportingFor = time.Duration(max(now-u.since.Load(), 0))
	return s
}

// Reset forgets every report (a publisher removed and added back).
func (u *Upstream) Reset() {
	u.last.Store(0)
	u.since.Store(0)
}
