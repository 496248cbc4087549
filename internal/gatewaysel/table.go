// Package gatewaysel is Optimal Gateway Selection per client location, as
// Cisco AnyConnect does it: probe every gateway a few times, keep each
// gateway's lowest RTT and order the gateways by gatewayorder's rule.
// Results are cached per location for a long time (14 days by default), a
// probe run never outlasts its deadline (7 s), and when it yields nothing the
// location keeps its previous selection. Replicas share results and one probe
// run per location through a ResultStore, and client reports
// (internal/rttreports) may decide a location's order. It knows nothing of
// CoreDNS: the ogs plugin adapts it.
package gatewaysel

import (
	"context"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

type entry struct {
	res         *gatewayorder.Result // nil until a run has produced one
	epoch       uint64               // the measurement epoch res belongs to
	failed      *gatewayorder.Result // the latest run in which no gateway answered, if later than res
	flight      chan struct{}
	started     time.Time // when the run in flight started
	progress    *progress // the run in flight's measurements so far
	retryAt     time.Time // no new run before this, after a run with no result
	lastUsed    time.Time
	view        *gatewayorder.Result // res as answered, given the re-check (recheck.go)
	viewOf      *gatewayorder.Result // the res view was derived from
	viewVer     uint64               // the deadVer view was derived at
	fromReplica bool                 // res was read from the store, not probed here
	pending     bool                 // res was probed here and is not the stored result yet (see reconcile)
	token       string               // with pending: the lock token res is published under (claim.unconfirmed)
	hold        holdState
	last        string               // the first choice of the latest answer (Selection.LastServer)
	hitOf       *gatewayorder.Result // the result a cache hit was last reported for (Selection.FirstHit)
}

// progress is what a probe run has measured so far, so that a query whose
// wait ends before the run does is answered with the gateways that answered.
// Its fields are written and read with Table.mu held.
type progress struct {
	gws     []gatewayorder.Gateway
	omit    bool
	best    []time.Duration // lowest RTT so far per gateway (0: none yet)
	reasons []string        // per gateway, why its last failed probe failed
}

// Table answers "which gateways, in which order" per location. It is
// process state: one Table outlives configuration reloads (see Pool and
// Reconfigure), so its probe runs and cached results are never lost or
// repeated because of a reload.
type Table struct {
	now func() time.Time

	mu      sync.Mutex
	cfg     Config
	byName  map[string]int
	epoch   uint64 // bumped when cached measurements stop being comparable
	entries map[string]*entry
	dead    map[string]string // gateway name → re-check failure reason
	deadVer uint64            // bumped when dead changes

	ctx     context.Context // ends at Close: probe runs and background work
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	saves   chan struct{}
	started bool
	closed  bool

	reports *rttreports.Reports // client reports; own lock, taken after mu

	runs    uint64    // probe runs made by this selector
	lastRun time.Time // when the latest one finished

	storeDown      bool                            // some keys are in trouble (troubles is not empty)
	storeDownUntil time.Time                       // the store rests until then after an error
	troubles       map[StoreKeys]StoreTroubleState // keys the store fails on, until a call on them succeeds
	storeGen       string                          // the store's generation marker last seen (generation.go)

	reportCursor         int64              // ReportStore: changes before this (store clock, ms) are merged
	reportBacklog        map[reportKey]bool // reporters whose write to the ReportStore failed
	reportBacklogDropped uint64             // reporters not queued: the backlog was full
}

// NewSelector returns a selector with defaults filled in.
func NewTable(cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.FillDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Table{now: time.Now, epoch: 1, entries: map[string]*entry{}, dead: map[string]string{}, troubles: map[StoreKeys]StoreTroubleState{}, ctx: ctx, cancel: cancel, saves: make(chan struct{}, 1), reports: rttreports.NewReports()}
	s.setConfig(cfg)
	return s, nil
}

// setConfig installs cfg; called with s.mu held (or before s is shared).
func (s *Table) setConfig(cfg Config) {
	s.cfg = cfg
	s.byName = make(map[string]int, len(cfg.Gateways))
	for i, g := range cfg.Gateways {
		s.byName[g.Name] = i
	}
	s.reports.Configure(cfg.Reports, cfg.Gateways, cfg.OmitUnmeasured)
}

// Reports returns the selector's client reports (process state, kept
// across reloads with the selector).
func (s *Table) Reports() *rttreports.Reports { return s.reports }

// Config returns the configuration in force, with defaults filled in.
func (s *Table) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// fresh reports whether e's result answers without a new run at now;
// called with s.mu held.
func (s *Table) fresh(e *entry, now time.Time) bool {
	return e.res != nil && e.epoch == s.epoch && now.Sub(e.res.At) < s.cfg.CacheTTL
}

// Select returns the order for location. A fresh cached result answers at
// once. Otherwise one probe run starts for the location (never more than one
// at a time, none within Retry of a run in which no gateway answered) and the
// caller waits for it, until the answer deadline (Config.Wait) after the
// run started: the run goes on in the background and its result answers the
// next queries. A query arriving later than that, or whose wait ends first,
// gets, in this order of preference, the
// gateways the run has heard from so far, ordered by the rule (Partial);
// the location's previous selection; the configured order. A run that
// finished with no gateway answering gives the last two at once.
func (s *Table) Select(ctx context.Context, location string) Selection {
	return s.SelectReported(ctx, location, "")
}

// SelectReported is Select, except that a location whose clients' reports
// (under reportKey, the network the reports came from) are enough answers
// from them, with the re-check's findings applied, and starts no probe run.
func (s *Table) SelectReported(ctx context.Context, location, reportKey string) Selection {
	now := s.now()
	s.mu.Lock()
	e := s.entries[location]
	if e == nil {
		e = &entry{}
		s.evictIfFull()
		s.entries[location] = e
	}
	e.lastUsed = now
	if reportKey != "" {
		if res, n, ok := s.reports.Order(reportKey, now); ok {
			if len(s.dead) > 0 {
				res = s.demote(res)
			}
			sel := s.conclude(e, Selection{Result: res, Source: Reported, Reporters: n}, now)
			s.mu.Unlock()
			return sel
		}
	}
	if s.fresh(e, now) {
		sel := Selection{Result: s.answered(e), Source: Cached, FirstHit: e.hitOf != e.res}
		e.hitOf = e.res
		sel = s.conclude(e, sel, now)
		s.mu.Unlock()
		return sel
	}
	flight := e.flight
	why := WhyDeadline
	switch {
	case flight != nil:
	case s.closed:
		why = WhyClosed
	case now.Before(e.retryAt):
		why = WhyRetryWait
	default:
		flight = make(chan struct{})
		e.flight, e.started = flight, now
		e.progress = nil
		s.wg.Add(1)
		go s.fetchOrRun(location, e, flight, s.cfg, s.epoch)
	}
	// The answer deadline counts from the run's start, not from this
	// query's arrival: a resolver that retries a query (unbound resends
	// after a few hundred milliseconds, each time with a new ID, and takes
	// only the reply to the latest) must get its answer by then too.
	wait := s.cfg.Wait() - now.Sub(e.started)
	s.mu.Unlock()

	why = awaitRun(ctx, flight, why, wait)
	s.mu.Lock()
	defer s.mu.Unlock()
	sel := s.afterWait(e, why)
	return s.conclude(e, sel, s.now())
}

// awaitRun waits for the run in flight to end, for at most wait or until
// ctx ends, unless why says that no run is coming (closed, or waiting to
// retry). It returns why is WhyNoAnswer if the run ended, else why: what a
// selection without a fresh result says, if it has none.
func awaitRun(ctx context.Context, flight chan struct{}, why Why, wait time.Duration) Why {
	if why != WhyClosed && why != WhyRetryWait && wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-flight:
			why = WhyNoAnswer
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	if why == WhyDeadline {
		select {
		case <-flight: // ended without a result while we did not wait
			why = WhyNoAnswer
		default:
		}
	}
	return why
}

// afterWait is the selection of location entry e once a query's wait has
// ended (why: see awaitRun): the run's fresh result, else the gateways a
// run still going has heard from, else the previous selection, else the
// configured order. Called with s.mu held.
func (s *Table) afterWait(e *entry, why Why) Selection {
	if s.fresh(e, s.now()) {
		if e.fromReplica {
			return Selection{Result: s.answered(e), Source: FromReplica}
		}
		return Selection{Result: s.answered(e), Source: Probed}
	}
	sel := Selection{Why: why, Failed: e.failed, RetryAt: e.retryAt}
	if why == WhyDeadline && e.flight != nil {
		if res := s.partial(e.progress); res != nil {
			sel.Result, sel.Source = res, Partial
			return sel
		}
	}
	sel.Result, sel.Source = s.answered(e), Previous
	if sel.Result == nil {
		sel.Result, sel.Source = s.configured(), Configured
	}
	return sel
}

// partial orders what a run in flight has measured so far, by the one rule
// (gateways not heard from yet count as not measured), on the configuration
// in force and with the re-check's findings; nil when no gateway has
// answered yet. Called with s.mu held.
func (s *Table) partial(p *progress) *gatewayorder.Result {
	if p == nil || !slices.ContainsFunc(p.best, func(d time.Duration) bool { return d > 0 }) {
		return nil
	}
	res := &gatewayorder.Result{Gateways: p.gws, RTTs: slices.Clone(p.best), Reasons: slices.Clone(p.reasons), At: s.now()}
	res.Order = gatewayorder.Order(p.gws, res.RTTs, p.omit)
	if !sameGateways(p.gws, s.cfg.Gateways) || p.omit != s.cfg.OmitUnmeasured {
		if res = s.remap(res); res == nil {
			return nil
		}
	}
	if len(s.dead) > 0 {
		res = s.demote(res)
	}
	return res
}

// configured is the configured order; called with s.mu held.
func (s *Table) configured() *gatewayorder.Result {
	n := len(s.cfg.Gateways)
	r := &gatewayorder.Result{Gateways: s.cfg.Gateways, Order: make([]int, n), RTTs: make([]time.Duration, n)}
	for i := range r.Order {
		r.Order[i] = i
	}
	return r
}

// run probes every gateway of cfg at once: each gateway's probes start
// ProbeSpacing apart, each bounded by ProbeTimeout, and all by Deadline, so
// a run lasts about the slowest answer (or one probe timeout, when a
// gateway is silent) plus the spacing. Every probe that answers updates the
// run's progress (see Select); when all have ended the result is stored,
// unless nothing answered. cfg and epoch are those in force when the run
// started; a reload during the run maps its result onto the new
// configuration by gateway name (see Reconfigure).
// With a store, the result is published before the local queries get it
// (see publish): they answer the stored result, which is the run's unless
// another replica's won the race. A probe lock held (c) is extended while
// the run goes and released by the publish.
func (s *Table) run(location string, e *entry, done chan struct{}, cfg Config, epoch uint64, c *claim) {
	ctx, cancel := context.WithTimeout(s.ctx, cfg.Deadline)
	defer cancel()
	if c.held() {
		stop := make(chan struct{})
		defer close(stop)
		s.wg.Add(1)
		go s.keepLock(location, c, cfg, stop)
	}
	n := len(cfg.Gateways)
	prog := &progress{gws: cfg.Gateways, omit: cfg.OmitUnmeasured, best: make([]time.Duration, n), reasons: make([]string, n)}
	s.mu.Lock()
	e.progress = prog
	s.mu.Unlock()
	all, why, errs := s.probeAll(ctx, location, cfg, prog)
	best := prog.best // no writer is left
	reasons := make([]string, n)
	any := false
	for i := range best {
		any = any || best[i] > 0
		reasons[i] = Reason(errs[i])
	}
	var probed *gatewayorder.Result
	if any {
		probed = &gatewayorder.Result{Gateways: cfg.Gateways, Order: gatewayorder.Order(cfg.Gateways, best, cfg.OmitUnmeasured), RTTs: best, Reasons: reasons, At: s.now()}
	}
	s.mu.Lock()
	s.carryHold(e, probed, s.now())
	s.mu.Unlock()
	out := s.publish(location, probed, cfg, c, false)
	s.mu.Lock()
	res := out.res
	if out.fromReplica && res != nil {
		s.adoptHold(e, res, s.now())
	}
	if res != nil && (!sameGateways(cfg.Gateways, s.cfg.Gateways) || cfg.OmitUnmeasured != s.cfg.OmitUnmeasured) {
		res = s.remap(res)
	}
	switch {
	case res != nil:
		e.res, e.epoch, e.failed, e.fromReplica, e.pending, e.token = res, epoch, nil, out.fromReplica, out.pending, out.token
	case !any:
		e.retryAt = s.now().Add(cfg.Retry)
		e.failed = &gatewayorder.Result{Gateways: cfg.Gateways, RTTs: best, Reasons: reasons, At: s.now()}
	}
	e.flight, e.progress = nil, nil
	s.runs++
	s.lastRun = s.now()
	run := Run{Location: location, Gateways: cfg.Gateways, RTTs: all, Reasons: why, Errors: errs, Result: res, FromReplica: out.fromReplica, RetryAt: e.retryAt, LastServer: e.last}
	if res == nil {
		run.Previous = e.res
	}
	onRun := s.cfg.OnRun
	s.mu.Unlock()
	close(done)
	if onRun != nil {
		onRun(run)
	}
	if res != nil {
		s.requestSave()
	}
}

// probeAll runs every probe of cfg, updating prog as they answer, and
// returns every probe's RTT (0: failed) and failure reason, per gateway,
// and each gateway's last failed probe's error, in probe order.
func (s *Table) probeAll(ctx context.Context, location string, cfg Config, prog *progress) (all [][]time.Duration, why [][]string, errs []error) {
	n := len(cfg.Gateways)
	all = make([][]time.Duration, n)
	why = make([][]string, n)
	errsAt := make([][]error, n)
	var wg sync.WaitGroup
	for i, g := range cfg.Gateways {
		if cfg.OnProbeStart != nil {
			cfg.OnProbeStart(location, g)
		}
		all[i] = make([]time.Duration, cfg.Probes)
		why[i] = make([]string, cfg.Probes)
		errsAt[i] = make([]error, cfg.Probes)
		for k := range cfg.Probes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !sleep(ctx, time.Duration(k)*cfg.ProbeSpacing) {
					all[i][k], why[i][k], errsAt[i][k] = 0, Reason(ctx.Err()), ctx.Err()
					return
				}
				r := latency.Measure(ctx, cfg.Prober, g.Addr, 1, cfg.ProbeTimeout)
				all[i][k], why[i][k], errsAt[i][k] = r.Best, Reason(r.Err), r.Err
				s.mu.Lock()
				if r.OK > 0 && (prog.best[i] == 0 || r.Best < prog.best[i]) {
					prog.best[i] = r.Best
				} else if r.OK == 0 {
					prog.reasons[i] = Reason(r.Err)
				}
				s.mu.Unlock()
			}()
		}
	}
	wg.Wait()
	errs = make([]error, n)
	for i := range errsAt {
		for _, err := range errsAt[i] {
			if err != nil {
				errs[i] = err // the last failed probe's, in probe order
			}
		}
	}
	return all, why, errs
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// evictIfFull makes room for one more location; called with s.mu held.
func (s *Table) evictIfFull() { s.evictTo(s.cfg.MaxLocations - 1) }

// evictTo drops least recently used locations until at most n remain
// (locations with a probe run in flight stay); called with s.mu held. It
// scans the table, so eviction costs O(n), but only once per new location
// beyond the bound, and a probe run costs far more.
func (s *Table) evictTo(n int) {
	for len(s.entries) > n {
		var victim string
		var oldest time.Time
		for loc, e := range s.entries {
			if e.flight != nil {
				continue
			}
			if victim == "" || e.lastUsed.Before(oldest) {
				victim, oldest = loc, e.lastUsed
			}
		}
		if victim == "" {
			return
		}
		delete(s.entries, victim)
	}
}

// Forget drops every cached result, so the next query of each location
// probes again, as deleting AnyConnect's preferences file does.
func (s *Table) Forget() {
	s.mu.Lock()
	for loc, e := range s.entries {
		if e.flight == nil {
			delete(s.entries, loc)
		} else {
			e.res, e.hold = nil, holdState{}
		}
	}
	s.mu.Unlock()
}

// Len returns the number of locations held.
func (s *Table) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Start begins the background work: saving new results to the cache file,
// watching it for deletion, and re-checking first choices. Call it once, after Load.
func (s *Table) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return
	}
	s.started = true
	s.wg.Add(3)
	go s.recheck()
	go s.syncReports()
	// Whether the file is there now: deleting it later forgets every location.
	_, err := os.Stat(s.cfg.CacheFile)
	go s.persist(time.Second, s.cfg.CacheFile, s.cfg.CacheFile != "" && err == nil)
}

// Close stops probe runs and background work, waits for them, and saves the
// cache file. The Table answers no more probe runs afterwards.
func (s *Table) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	if path := s.Config().CacheFile; path != "" {
		return s.Save(path)
	}
	return nil
}
