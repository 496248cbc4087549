package pubsel

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

// Backend-reported load (ORCA) in within p2c's cost. A backend may report
// its own utilization in each answer (orca.Header); the adapter that ends
// a Flight hands the header's value to ReportLoad, which keeps it per
// target with A58's periods (orca.Upstream). A pick then multiplies the
// cost of a target whose report is fresh by LoadFactor of its utilization;
// one in blackout, expired or never reported takes the factor of the
// other drawn (see factors).

// MaxReportedUtilization caps the utilization LoadFactor uses, so a
// backend reporting 1 or more (ORCA allows it past a soft limit) is
// expensive, not infinitely so: its factor is 20.
const MaxReportedUtilization = 0.95

// LoadFactor is what a fresh report of utilization u multiplies a cost by:
// 1 / (1 − min(u, 0.95)), so 0 → 1, 0.3 → 1.43, 0.5 → 2, 0.95 and above
// → 20. It is the expected wait of a single-server queue at that load, in
// units of its service time: a publisher twice as busy by its own account
// costs as if it had twice the requests ahead of a new one.
func LoadFactor(u float64) float64 {
	return 1 / (1 - min(max(u, 0), MaxReportedUtilization))
}

// loadReports counts ORCA headers by outcome: absent, or the parse's or
// Observe's Reason (orca.ReasonOK for a report taken).
type loadReports struct {
	absent   atomic.Uint64
	byReason [orca.NumReasons]atomic.Uint64
}

// ORCA reports whether the tracker takes backends' load reports.
func (t *Tracker) ORCA() bool { return t.cfg.Load().ORCA }

// ReportLoad records the load report of f's answer: value is the answer's
// orca.Header (or, with bin, its orca.HeaderBin) value, "" if it had
// none, received at now (unix ns, the clock picks are made on). A value
// that does not parse, is over orca.MaxHeaderLen, or carries no
// utilization changes nothing and is counted by its reason; so is an
// absent one, as absent. With ORCA off it does nothing.
//
// The parse allocates nothing for TEXT and JSON (the report lives on the
// stack); BIN allocates one string per named metric.
func (t *Tracker) ReportLoad(f Flight, value string, bin bool, now int64) orca.Reason {
	cfg := t.cfg.Load()
	if !cfg.ORCA || f.tg == nil {
		return orca.ReasonOK
	}
	if value == "" {
		t.reports.absent.Add(1)
		return orca.ReasonEmpty
	}
	var r orca.Report
	why := orca.ReasonOK
	if bin {
		why = orca.ParseBin(value, &r)
	} else {
		why = orca.Parse(value, &r)
	}
	if why == orca.ReasonOK {
		if why = f.tg.load.Observe(&r, now, cfg.ORCAPeriods); why == orca.ReasonOK {
			u, _ := r.Utilization()
			f.tg.factor.Store(math.Float64bits(LoadFactor(u)))
			if !f.tg.reported.Load() {
				f.tg.reported.Store(true)
			}
		}
	}
	t.reports.byReason[why].Add(1)
	return why
}

// LoadReports returns the ORCA headers counted so far: absent, and the
// rest by Reason (index orca.ReasonOK: taken).
func (t *Tracker) LoadReports() (absent uint64, byReason [orca.NumReasons]uint64) {
	for i := range byReason {
		byReason[i] = t.reports.byReason[i].Load()
	}
	return t.reports.absent.Load(), byReason
}

// loadFactor is tg's LoadFactor at now and true if its report is fresh,
// else 1 and false (also for nil: an upstream not probed).
func (tg *target) loadFactor(now int64, p orca.Periods) (float64, bool) {
	if tg == nil {
		return 1, false
	}
	if !tg.load.Fresh(now, p) {
		return 1, false
	}
	// The latest report's factor, computed when it came: a pick divides
	// nothing. (A reader may pair one report's state with the next one's
	// factor: both are the backend's word within a request of each other.)
	return math.Float64frombits(tg.factor.Load()), true
}

// Load is one target as a p2c pick sees it now, for the admin view and
// metrics.
type Load struct {
	InFlight int64
	Estimate time.Duration // see Estimate
	// PerRequest is what a pick uses: Estimate ÷ the status's
	// ObservedInFlight, or a confirmed answer's figure since (raise).
	PerRequest time.Duration
	Factor     float64       // LoadFactor of a fresh report, else 1 (a pick may use the other's); 1 with ORCA off
	Cost       time.Duration // Cost(PerRequest, InFlight) × Factor
	ORCA       orca.Snapshot // the latest report (State none if never)
	// SlowStart is how far the target is through its slow start, in
	// [0, 1), while Warming.
	SlowStart float64
	Warming   bool
}

// LoadOf returns target id's Load at now (unix ns).
func (t *Tracker) LoadOf(id uint32, now int64) Load {
	byID := *t.byID.Load()
	if int(id) >= len(byID) || byID[id] == nil {
		return Load{Factor: 1}
	}
	tg := byID[id]
	cfg := t.cfg.Load()
	st := tg.status.Load()
	l := Load{InFlight: max(tg.inFlight.Load(), 0), Estimate: Estimate(st), PerRequest: time.Duration(tg.estimate.Load()), Factor: 1}
	l.ORCA = tg.load.Snapshot(now, cfg.ORCAPeriods)
	if cfg.ORCA {
		l.Factor, _ = tg.loadFactor(now, cfg.ORCAPeriods)
	}
	l.Cost = time.Duration(float64(Cost(l.PerRequest, l.InFlight)) * l.Factor)
	if since, window := tg.warmSince.Load(), tg.warmWindow.Load(); since != 0 && window > 0 && now-since < window {
		l.SlowStart, l.Warming = float64(max(now-since, 0))/float64(window), true
	}
	return l
}
