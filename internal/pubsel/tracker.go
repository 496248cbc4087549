// Package pubsel selects a publisher (an upstream) the way Netskope NPA's
// latency-based publisher selection does: each publisher's latency is probed,
// sorted into exponential buckets ([0,32), [32,64), [64,128)… ms), and a
// pick is made at random among the active publishers of the lowest non-empty
// bucket; a (user, app) pair then stays on its publisher while that one stays
// active. It knows nothing of Caddy: the HTTP and layer4 policies adapt it.
package pubsel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/orca"
	"github.com/edgesteer/edgesteer/internal/peakewma"
	"github.com/edgesteer/edgesteer/internal/sticky"
)

// Defaults. The bucket width is Netskope's ([0,32), [32,64)… ms); the
// probe counts and intervals are ours.
const (
	DefaultBucketWidth = 32 * time.Millisecond
	DefaultHysteresis  = 0.1
	DefaultProbes      = 3
	DefaultInterval    = 10 * time.Second
	DefaultWindow      = 3
	DefaultTimeout     = 2 * time.Second
	DefaultMaxTargets  = 1024
	DefaultHalfLife    = 10 * time.Second
)

// Source says which latency a publisher is bucketed by.
type Source int

// The latency sources (`latency probe|traffic|both`).
const (
	// FromProbe buckets by probe latency alone (the default, and the
	// behaviour before traffic was observed).
	FromProbe Source = iota
	// FromTraffic buckets by the latency observed on real requests (the
	// peak-EWMA), the probe latency standing in until traffic is seen.
	FromTraffic
	// FromBoth buckets by the higher of the two.
	FromBoth
)

// Config configures a Tracker.
type Config struct {
	// BucketWidth is w in the buckets [0,w), [w,2w), [2w,4w)…
	BucketWidth time.Duration
	// NoBuckets puts every active publisher in one bucket (`latency off`).
	NoBuckets bool
	// Hysteresis widens the current bucket's bounds by this fraction before
	// a publisher moves out of it (see latency.Rebucket); 0 is none. The
	// adapters default it to DefaultHysteresis.
	Hysteresis float64
	// Probes per round, Interval between rounds, Timeout per probe.
	Probes   int
	Interval time.Duration
	Timeout  time.Duration
	// Window is how many rounds the latency's minimum is taken over.
	Window int
	// Prober measures one round trip.
	Prober latency.Prober
	// Segments adds a fixed latency per address: a leg the probes do not
	// cross (Netskope's client gateway → stitcher leg).
	Segments map[string]time.Duration
	// MaxTargets bounds how many addresses are probed; others stay
	// unmeasured.
	MaxTargets int
	// ProbeID names what Prober measures (kind, path, host…): rounds taken
	// under another ProbeID are not comparable, so Apply with a new one
	// forgets every measurement.
	ProbeID string
	// OnRound, if set, is called after every probe round of a target.
	OnRound func(addr string, r latency.Result)
	// Source is what buckets are computed from (FromProbe by default).
	Source Source
	// HalfLife is the decay half-life of the observed latency.
	HalfLife time.Duration
	// FailureLatency is what a failed or timed-out real request counts as
	// (at least); default Timeout.
	FailureLatency time.Duration
	// ORCA takes the load backends report in their answers (ReportLoad)
	// into within p2c's cost, with ORCAPeriods (A58's blackout and
	// expiration; zero value: orca.DefaultPeriods). Off, reports are
	// neither read nor counted.
	ORCA        bool
	ORCAPeriods orca.Periods
}

func (c *Config) setDefaults() {
	orDefault(&c.BucketWidth, DefaultBucketWidth)
	orDefault(&c.Probes, DefaultProbes)
	orDefault(&c.Interval, DefaultInterval)
	orDefault(&c.Timeout, DefaultTimeout)
	orDefault(&c.Window, DefaultWindow)
	orDefault(&c.MaxTargets, DefaultMaxTargets)
	orDefault(&c.HalfLife, DefaultHalfLife)
	orDefault(&c.FailureLatency, c.Timeout)
	orDefault(&c.ORCAPeriods, orca.DefaultPeriods)
	if c.Prober == nil {
		c.Prober = latency.TCPProber{}
	}
}

// orDefault sets *v to def if *v is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate reports the first bad setting, naming it.
func (c *Config) Validate() error {
	switch {
	case c.BucketWidth < 0:
		return fmt.Errorf("bucket_width must be positive, got %v", c.BucketWidth)
	case c.Hysteresis < 0 || c.Hysteresis >= 1:
		return fmt.Errorf("hysteresis must be in [0,1), got %v", c.Hysteresis)
	case c.Probes < 0:
		return fmt.Errorf("probes must be at least 1, got %d", c.Probes)
	case c.Interval < 0:
		return fmt.Errorf("interval must be positive, got %v", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %v", c.Timeout)
	case c.Window < 0:
		return fmt.Errorf("window must be at least 1, got %d", c.Window)
	case c.Source < FromProbe || c.Source > FromBoth:
		return fmt.Errorf("latency source must be probe, traffic or both, got %d", c.Source)
	case c.HalfLife < 0:
		return fmt.Errorf("half-life must be positive, got %v", c.HalfLife)
	case c.FailureLatency < 0:
		return fmt.Errorf("failure latency must be positive, got %v", c.FailureLatency)
	case c.MaxTargets < 0 || c.MaxTargets > sticky.IDMask:
		return fmt.Errorf("max targets must be in [1, %d], got %d", sticky.IDMask, c.MaxTargets)
	}
	if c.ORCA && c.ORCAPeriods != (orca.Periods{}) {
		if err := c.ORCAPeriods.Check(); err != nil {
			return fmt.Errorf("orca: %v", err)
		}
	}
	for addr, d := range c.Segments {
		if d < 0 {
			return fmt.Errorf("segment %s must not be negative, got %v", addr, d)
		}
	}
	return nil
}

// Status is one publisher's state as the tracker last saw it.
type Status struct {
	Addr    string        `json:"address"`
	ID      uint32        `json:"id"`
	Latency time.Duration `json:"latency_ns"` // the figure bucketed: see DecidedBy
	// ProbeLatency is the probe minimum over the window + segment.
	ProbeLatency time.Duration `json:"probe_latency_ns"`
	// Observed and ObservedPeak are the traffic figures (peak-EWMA) when
	// the status was derived; ObservedSamples how many were counted.
	Observed        time.Duration `json:"observed_ns"`
	ObservedPeak    time.Duration `json:"observed_peak_ns"`
	ObservedSamples uint64        `json:"observed_samples"`
	// ObservedInFlight is the mean number of requests in flight, each
	// itself included, that the measured requests saw as they began (an
	// EWMA with the half-life; 1 until any): the load at which Observed
	// and ObservedPeak were measured (PerRequest).
	ObservedInFlight float64 `json:"observed_in_flight"`
	// DecidedBy is "probe" or "traffic": which figure is Latency.
	DecidedBy string          `json:"decided_by"`
	Probed    time.Duration   `json:"probed_ns"` // the probe minimum alone
	Segment   time.Duration   `json:"segment_ns"`
	Bucket    int             `json:"bucket"`       // latency.Unmeasured until measured
	Label     string          `json:"bucket_label"` // "[0,32)", "unmeasured", or "all" with NoBuckets
	Measured  bool            `json:"measured"`
	Active    bool            `json:"active"`
	Window    int             `json:"window"` // successful rounds in the window
	LastRTTs  []time.Duration `json:"last_rtts_ns,omitempty"`
	LastError string          `json:"last_error,omitempty"`
	LastProbe time.Time       `json:"last_probe,omitzero"`
	Rounds    uint64          `json:"rounds"`
}

type target struct {
	addr    string
	id      uint32
	status  atomic.Pointer[Status]
	removed atomic.Bool

	// Under Tracker.mu:
	refs   int                // holders using the target
	pinned bool               // added by Tracker.Ensure: kept until Stop
	cancel context.CancelFunc // stops its prober; nil before Start

	mu     sync.Mutex      // orders rounds and re-applied settings
	window []time.Duration // best RTT of recent successful rounds, newest last

	observed peakewma.EWMA // real traffic: recorded lock-free, folded under mu
	began    flightLoad    // the in-flight counts the measured requests began with
	inFlight atomic.Int64  // requests or connections in flight (Begin to Done)
	estimate atomic.Int64  // PerRequest(status), ns: set with status (setStatus)
	load     orca.Upstream // the backend's own latest load report (ReportLoad)
	factor   atomic.Uint64 // LoadFactor of load's utilization (float64 bits)
	reported atomic.Bool   // load has had a report (a pick skips factors until then)

	// The slow start of the latest view that has the target in its lowest
	// bucket (unix ns, 0: none) and that view's window, for the admin view.
	warmSince, warmWindow atomic.Int64
}

// Tracker probes publishers in the background and keeps their status. Its
// targets outlive any one user: holders (one per config generation) share
// them, and a target is dropped when its last holder lets go.
type Tracker struct {
	cfg   atomic.Pointer[Config]
	epoch atomic.Uint64 // bumped when ProbeID changes: older rounds are discarded
	wake  atomic.Pointer[chan struct{}]

	mu      sync.Mutex
	targets map[string]*target
	free    []uint32                           // ids of removed targets, for reuse
	byID    atomic.Pointer[[]*target]          // copy-on-write, indexed by id
	byAddr  atomic.Pointer[map[string]*target] // copy-on-write, for Observe
	gen     atomic.Uint64                      // bumped when any bucket or activity changes
	reports loadReports                        // ORCA headers by outcome (ReportLoad)
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewTracker returns a tracker; probing begins with Start.
func NewTracker(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	t := &Tracker{targets: map[string]*target{}}
	t.cfg.Store(&cfg)
	t.byID.Store(&[]*target{})
	t.byAddr.Store(&map[string]*target{})
	wake := make(chan struct{})
	t.wake.Store(&wake)
	return t, nil
}

// Config returns the tracker's configuration with defaults filled in.
func (t *Tracker) Config() Config { return *t.cfg.Load() }

// Start begins probing every known target and those added later. The
// probers run until Stop, whoever started them: they belong to the
// tracker, not to the caller's request or config lifetime.
func (t *Tracker) Start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx != nil {
		return
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, tg := range t.targets {
		t.launch(tg)
	}
}

// Stop ends probing and waits for the probers to return.
func (t *Tracker) Stop() {
	t.mu.Lock()
	cancel := t.cancel
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	t.wg.Wait()
	closeIdle(t.cfg.Load().Prober)
}

// ErrTooManyTargets is returned by Ensure past Config.MaxTargets.
var ErrTooManyTargets = errors.New("pubsel: too many probe targets")

// ErrReleased is returned by Holder.Ensure after Release for an address no
// holder has.
var ErrReleased = errors.New("pubsel: holder released")

// Ensure registers addr (host:port) as a target for the tracker's lifetime
// and returns its id. A new target starts unmeasured and active; it is
// probed at once if the tracker has started.
func (t *Tracker) Ensure(addr string) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tg, err := t.ensureLocked(addr)
	if err != nil {
		return 0, err
	}
	tg.pinned = true
	return tg.id, nil
}

func (t *Tracker) ensureLocked(addr string) (*target, error) {
	if tg, ok := t.targets[addr]; ok {
		return tg, nil
	}
	if len(t.targets) >= t.cfg.Load().MaxTargets {
		return nil, ErrTooManyTargets
	}
	old := *t.byID.Load()
	id := uint32(len(old))
	if n := len(t.free); n > 0 {
		id, t.free = t.free[n-1], t.free[:n-1]
	}
	byID := make([]*target, max(len(old), int(id)+1))
	copy(byID, old)
	tg := &target{addr: addr, id: id}
	tg.setStatus(t.fresh(addr, id))
	byID[id] = tg
	t.targets[addr] = tg
	t.byID.Store(&byID)
	t.publishAddrs()
	t.gen.Add(1)
	if t.ctx != nil {
		t.launch(tg)
	}
	return tg, nil
}

// publishAddrs copies the address index read by Observe; t.mu is held.
func (t *Tracker) publishAddrs() {
	m := make(map[string]*target, len(t.targets))
	for a, tg := range t.targets {
		m[a] = tg
	}
	t.byAddr.Store(&m)
}

// Observe records the latency of one real request or connection to addr
// (time to response headers, or connect time); a failed one (error or
// timeout) counts as at least FailureLatency. It is the request path: one
// lookup in a copy-on-write index, two atomic read-modify-writes, no lock,
// no allocation, no clock read. The samples are folded into the figures
// at the next Reevaluate (every 250 ms) or probe round. An address not
// probed is ignored.
func (t *Tracker) Observe(addr string, d time.Duration, failed bool) {
	t.ObserveFlight(Flight{tg: (*t.byAddr.Load())[addr]}, d, failed)
}

// Reevaluate derives every measured target's figure and bucket again
// from its kept probe window and its observed latency at now, under the
// hysteresis rule: with Source traffic or both, traffic moves buckets
// between probe rounds. With FromProbe it refreshes the observed figures
// of the status only.
func (t *Tracker) Reevaluate(now time.Time) {
	cfg := t.cfg.Load()
	for _, tg := range *t.byID.Load() {
		if tg == nil || tg.removed.Load() {
			continue
		}
		tg.mu.Lock()
		prev := tg.status.Load()
		if cfg.Source == FromProbe {
			// Only the observed figures, for the admin view: buckets
			// move with probe rounds alone.
			if st := *prev; observe(&st, tg, cfg, now, prev.ProbeLatency) {
				tg.setStatus(&st)
			}
		} else if prev.Measured && prev.Active {
			st := *prev
			t.deriveAt(&st, tg, cfg, prev.Bucket, prev.Label, now)
			tg.setStatus(&st)
			if st.Bucket != prev.Bucket {
				t.gen.Add(1)
			}
		}
		tg.mu.Unlock()
	}
}

// observe folds tg's traffic into st's observed figures at now (idle, the
// latencies decaying towards floor) and reports whether any was counted.
// Under tg.mu.
func observe(st *Status, tg *target, cfg *Config, now time.Time, floor time.Duration) bool {
	st.Observed, st.ObservedPeak, st.ObservedSamples = tg.observed.Value(now.UnixNano(), cfg.HalfLife, floor)
	st.ObservedInFlight = tg.began.value(now.UnixNano(), cfg.HalfLife)
	return st.ObservedSamples > 0
}

// fresh is the status of a target with no measurement: active, so that it
// can serve (after every measured one) until a round says otherwise.
func (t *Tracker) fresh(addr string, id uint32) *Status {
	return &Status{Addr: addr, ID: id, Segment: t.cfg.Load().Segments[addr],
		Bucket: latency.Unmeasured, Label: "unmeasured", Active: true}
}

// Generation changes whenever a target is added or removed or changes
// bucket or activity, so cached selection views know to rebuild.
func (t *Tracker) Generation() uint64 { return t.gen.Load() }

// StatusOf returns the status of target id.
func (t *Tracker) StatusOf(id uint32) *Status {
	byID := *t.byID.Load()
	if int(id) >= len(byID) || byID[id] == nil {
		return nil
	}
	return byID[id].status.Load()
}

// Statuses returns every current target's status, in id order.
func (t *Tracker) Statuses() []Status {
	byID := *t.byID.Load()
	out := make([]Status, 0, len(byID))
	for _, tg := range byID {
		if tg != nil && !tg.removed.Load() {
			out = append(out, *tg.status.Load())
		}
	}
	return out
}

// launch starts tg's prober; t.mu is held.
func (t *Tracker) launch(tg *target) {
	ctx, cancel := context.WithCancel(t.ctx)
	tg.cancel = cancel
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer cancel()
		for {
			start, epoch := time.Now(), t.epoch.Load()
			t.round(ctx, tg)
			if !t.wait(ctx, start, epoch) {
				return
			}
		}
	}()
}

// wait sleeps until the round begun at start is an interval old, re-timed
// when Apply changes the interval and cut short when it changes the probe.
// It reports false when ctx ends.
func (t *Tracker) wait(ctx context.Context, start time.Time, epoch uint64) bool {
	for {
		wake := *t.wake.Load()
		d := time.Until(start.Add(t.cfg.Load().Interval))
		if t.epoch.Load() != epoch || d <= 0 {
			return ctx.Err() == nil
		}
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
			return true
		case <-wake:
			timer.Stop()
		}
	}
}

// Round runs one probe round for target id now and records it.
func (t *Tracker) Round(ctx context.Context, id uint32) {
	byID := *t.byID.Load()
	if int(id) < len(byID) && byID[id] != nil {
		t.round(ctx, byID[id])
	}
}

func (t *Tracker) round(ctx context.Context, tg *target) {
	cfg, epoch := t.cfg.Load(), t.epoch.Load()
	r := latency.Measure(ctx, cfg.Prober, tg.addr, cfg.Probes, cfg.Timeout)
	if ctx.Err() != nil {
		return // stopping: a cancelled round says nothing about the target
	}
	if !t.record(tg, r, time.Now(), epoch) {
		return
	}
	if on := t.cfg.Load().OnRound; on != nil {
		on(tg.addr, r)
	}
}

// record folds one round, begun under probe epoch, into the target's
// status; it reports false if the probe changed meanwhile (the round is
// then discarded).
func (t *Tracker) record(tg *target, r latency.Result, now time.Time, epoch uint64) bool {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if t.epoch.Load() != epoch {
		return false
	}
	cfg := t.cfg.Load()
	prev := tg.status.Load()
	st := *prev
	st.LastRTTs, st.LastProbe, st.Rounds = r.RTTs, now, prev.Rounds+1
	st.LastError = ""
	if r.OK == 0 {
		st.Active = false
		if r.Err != nil {
			st.LastError = r.Err.Error()
		}
	} else {
		st.Active = true
		tg.window = append(tg.window, r.Best)
		if len(tg.window) > cfg.Window {
			tg.window = tg.window[len(tg.window)-cfg.Window:]
		}
		t.derive(&st, tg, cfg, prev.Bucket, prev.Label)
	}
	tg.setStatus(&st)
	if st.Active != prev.Active || st.Bucket != prev.Bucket {
		t.gen.Add(1)
	}
	return true
}

// derive sets latency and bucket from tg's window (tg.mu held). The bucket
// follows the cold-start rule: until the window holds cfg.Window rounds the
// target is placed by its current minimum alone; from then on hysteresis
// keeps it in bucket from while the latency stays within that bucket's
// widened bounds. So a noisy first round cannot hold a publisher in the
// wrong bucket: it is re-placed by every round until the window is full.
// label is from's label if known, saving a string per round.
func (t *Tracker) derive(st *Status, tg *target, cfg *Config, from int, label string) {
	t.deriveAt(st, tg, cfg, from, label, time.Now())
}

// deriveAt is derive at time now. The figure bucketed is, by cfg.Source:
// the probe latency; the observed peak (the probe latency until traffic
// is counted; idle, the peak decays towards it); or the higher of both.
func (t *Tracker) deriveAt(st *Status, tg *target, cfg *Config, from int, label string, now time.Time) {
	st.Segment = cfg.Segments[tg.addr]
	st.Window = len(tg.window)
	if len(tg.window) == 0 {
		st.Probed, st.Latency, st.ProbeLatency, st.Measured, st.DecidedBy = 0, 0, 0, false, ""
		st.Bucket, st.Label = latency.Unmeasured, "unmeasured"
		return
	}
	best := tg.window[0]
	for _, d := range tg.window[1:] {
		best = min(best, d)
	}
	st.Probed, st.ProbeLatency, st.Measured = best, best+st.Segment, true
	st.Latency, st.DecidedBy = st.ProbeLatency, "probe"
	observe(st, tg, cfg, now, st.ProbeLatency)
	if st.ObservedSamples > 0 && cfg.Source != FromProbe {
		if cfg.Source == FromTraffic || st.ObservedPeak > st.ProbeLatency {
			st.Latency, st.DecidedBy = st.ObservedPeak, "traffic"
		}
	}
	switch {
	case cfg.NoBuckets:
		st.Bucket, st.Label = 0, "all"
		return
	case len(tg.window) < cfg.Window:
		st.Bucket = latency.Bucket(st.Latency, cfg.BucketWidth)
	default:
		st.Bucket = latency.Rebucket(from, st.Latency, cfg.BucketWidth, cfg.Hysteresis)
	}
	if st.Bucket != from || label == "" {
		label = latency.Label(st.Bucket, cfg.BucketWidth)
	}
	st.Label = label
}
