package ogs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// Defaults: AnyConnect's 3 probes per gateway, 7 s probe run and 14 days of
// cache; a minute before a location whose gateways all failed is probed
// again; at most 100 000 cached locations.
const (
	DefaultProbes       = 3
	DefaultDeadline     = 7 * time.Second
	DefaultCacheTTL     = 14 * 24 * time.Hour
	DefaultRetry        = time.Minute
	DefaultMaxLocations = 100_000
)

// Defaults that keep a DNS client's first answer inside resolver timeouts
// (unbound drops a reply still pending after 1.9 s; stub resolvers retry
// after 5 s): a probe gives up after DefaultProbeTimeout, a gateway's probes
// start DefaultProbeSpacing apart (so a run costs about one RTT, not three),
// and no query waits longer than DefaultAnswerDeadline.
const (
	DefaultProbeTimeout   = 500 * time.Millisecond
	DefaultProbeSpacing   = 20 * time.Millisecond
	DefaultAnswerDeadline = 1500 * time.Millisecond
)

// Config configures a Selector. A running Selector takes a new one through
// Reconfigure (a reload).
type Config struct {
	Gateways []Gateway
	Prober   latency.Prober
	// ProbeID names the probe's kind and settings ("https / verify=false");
	// a change of it makes every cached measurement stale (Reconfigure).
	ProbeID        string
	Probes         int           // per gateway per run
	Deadline       time.Duration // the longest a whole probe run lasts
	ProbeTimeout   time.Duration // the longest one probe lasts
	ProbeSpacing   time.Duration // a gateway's probes start this far apart
	AnswerDeadline time.Duration // the longest a query waits (never beyond Deadline)
	CacheTTL       time.Duration // how long a location's result stands
	Retry          time.Duration // after a run with no result, wait this long before the next
	OmitUnmeasured bool
	MaxLocations   int
	// CacheFile, if set, keeps results across restarts (see Start).
	CacheFile string
	// Recheck is how often each cached first choice is probed once in the
	// background (see recheck.go); negative: never.
	Recheck time.Duration
	// Hold is how long a location's first choice stays first (hold.go);
	// negative: no hold.
	Hold time.Duration
	// OnRecheck, if set, is called after each re-check probe.
	OnRecheck func(Recheck)
	// OnRun, if set, is called after every probe run with its results.
	OnRun func(Run)
	// OnProbeStart, if set, is called as a run starts probing a gateway.
	OnProbeStart func(location string, g Gateway)
	// OnError, if set, gets background errors (saving the cache file).
	OnError func(error)

	// Store, if set, is a cache level shared with other replicas (see
	// shared.go); StoreTimeout bounds each call, StorePoll is how often a
	// replica waiting on another's probe run looks for its result, and
	// StoreRetry how long the store rests after an error.
	Store        Store
	StoreTimeout time.Duration
	StorePoll    time.Duration
	StoreRetry   time.Duration
	// OnStore, if set, is told what happened with the store.
	OnStore func(StoreEvent)
	// ReportStore, if set, shares client reports with other replicas
	// (reportshare.go), within StoreTimeout per call.
	ReportStore ReportStore

	// Reports, when enabled, orders a location from its clients' reports
	// (reports.go) once enough of them report.
	Reports ReportConfig
}

// Run is one finished probe run, as reported to Config.OnRun.
type Run struct {
	Location    string
	Gateways    []Gateway
	RTTs        [][]time.Duration // per gateway, every probe (0: failed)
	Reasons     [][]string        // per gateway, every probe's failure reason ("": succeeded)
	Errors      []error           // per gateway, its last failed probe's error (nil: none failed)
	Result      *Result           // what the location answers: nil when no gateway answered
	FromReplica bool              // Result is another replica's, stored first (this run lost the race)
	Previous    *Result           // without Result: the location's earlier result, if any
	RetryAt     time.Time         // without Result: no new run before this
	LastServer  string            // the first choice of the location's latest answer ("": none)
}

// Validate checks the configuration, naming the bad option.
func (c *Config) Validate() error {
	if len(c.Gateways) == 0 {
		return errors.New("no gateway configured")
	}
	seen := map[string]bool{}
	addrs := map[string]bool{}
	for _, g := range c.Gateways {
		if seen[g.Name] {
			return fmt.Errorf("gateway %s: duplicate name", g.Name)
		}
		if addrs[g.Addr] {
			return fmt.Errorf("gateway %s: duplicate address %s", g.Name, g.Addr)
		}
		seen[g.Name], addrs[g.Addr] = true, true
	}
	for _, g := range c.Gateways {
		unprobed := map[string]bool{}
		for _, u := range g.Unprobed {
			if seen[u.Name] || unprobed[u.Name] {
				return fmt.Errorf("gateway %s: backup %s=%s: the name of a gateway or of another backup", g.Name, u.Name, u.Addr)
			}
			unprobed[u.Name] = true
		}
		for _, b := range g.Backups {
			if !seen[b] && !unprobed[b] {
				return fmt.Errorf("gateway %s: backup %q is not a configured gateway", g.Name, b)
			}
		}
	}
	switch {
	case c.Probes < 0:
		return fmt.Errorf("probes %d: must be at least 1", c.Probes)
	case c.Deadline < 0:
		return fmt.Errorf("deadline %v: must be positive", c.Deadline)
	case c.ProbeTimeout < 0:
		return fmt.Errorf("probe_timeout %v: must be positive", c.ProbeTimeout)
	case c.ProbeSpacing < 0:
		return fmt.Errorf("probe spacing %v: must not be negative", c.ProbeSpacing)
	case c.AnswerDeadline < 0:
		return fmt.Errorf("answer_deadline %v: must be positive", c.AnswerDeadline)
	case c.CacheTTL < 0:
		return fmt.Errorf("cache_ttl %v: must be positive", c.CacheTTL)
	case c.MaxLocations < 0:
		return fmt.Errorf("max_locations %d: must be positive", c.MaxLocations)
	case c.StoreTimeout < 0 || c.StorePoll < 0 || c.StoreRetry < 0:
		return errors.New("store timings must be positive")
	}
	return c.Reports.Validate()
}

// Wait is how long a query waits for its location's probe run: the answer
// deadline, or the run's deadline when that is shorter.
func (c *Config) Wait() time.Duration { return min(c.AnswerDeadline, c.Deadline) }

// FillDefaults sets every unset field to its default.
func (c *Config) FillDefaults() {
	if c.Prober == nil {
		c.Prober = latency.TCPProber{}
	}
	orDefault(&c.Probes, DefaultProbes)
	orDefault(&c.Deadline, DefaultDeadline)
	orDefault(&c.ProbeTimeout, DefaultProbeTimeout)
	orDefault(&c.ProbeSpacing, DefaultProbeSpacing)
	orDefault(&c.AnswerDeadline, DefaultAnswerDeadline)
	orDefault(&c.CacheTTL, DefaultCacheTTL)
	orDefault(&c.Retry, DefaultRetry)
	orDefault(&c.MaxLocations, DefaultMaxLocations)
	orDefault(&c.Recheck, DefaultRecheck)
	orDefault(&c.Hold, DefaultHold)
	orDefault(&c.StoreTimeout, DefaultStoreTimeout)
	orDefault(&c.StorePoll, DefaultStorePoll)
	orDefault(&c.StoreRetry, DefaultStoreRetry)
	c.Reports.FillDefaults()
}

// orDefault sets *v to def if *v is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Source says where an answer's order came from.
type Source int

const (
	Probed      Source = iota // a probe run that finished within this query's wait
	Cached                    // a location entry still inside its lifetime
	Previous                  // no fresh result (see Why): the location's previous selection
	Configured                // no fresh result and none before: the configured order
	Partial                   // a probe run still going at the answer deadline: the gateways answered so far
	FromReplica               // a fresh result read from the shared store (another replica's probe run)
	Reported                  // the location's clients' reports (reports.go)
)

func (s Source) String() string {
	return [...]string{"probed", "cache", "previous", "configured", "partial", "shared", "reports"}[s]
}

// Fresh reports whether the selection is a finished probe run's result
// (answers may carry their full TTL), rather than a stand-in until one is.
func (s Source) Fresh() bool { return s == Probed || s == Cached || s == FromReplica || s == Reported }

// Why says why a Previous or Configured selection answered.
type Why int

const (
	WhyNone      Why = iota
	WhyDeadline      // the probe run was still going at the answer deadline
	WhyNoAnswer      // the probe run finished and no gateway answered
	WhyRetryWait     // no gateway answered the last run; the next waits for Retry
	WhyClosed        // the selector is shutting down
)

func (w Why) String() string {
	return [...]string{"", "deadline", "no_answer", "retry_wait", "closed"}[w]
}

// Selection is one query's answer.
type Selection struct {
	*Result
	Source Source
	Why    Why
	// Failed is the location's latest probe run in which no gateway
	// answered, when that is later than its result (Reasons say why).
	Failed  *Result
	RetryAt time.Time // after a run in which no gateway answered: the next run's earliest start
	// Reporters, with Source Reported, is the distinct reporters counted.
	Reporters int
	// HoldUntil is when the hold on the first choice ends (hold.go); zero:
	// no hold.
	HoldUntil time.Time
	// LastServer is the first choice of the location's previous answer
	// ("": none), AnyConnect's "Last server".
	LastServer string
	// FirstHit, with Source Cached, says this is the result's first cache
	// hit (so a log line per hit is bounded by results, not queries).
	FirstHit bool
}

// Result is one location's selection. It is never modified once made, so
// an answer being written may keep using it while a reload replaces it.
type Result struct {
	Gateways []Gateway       // the configuration the indices below refer to
	Order    []int           // gateway indices, best first
	RTTs     []time.Duration // lowest RTT per gateway (0: no successful probe)
	Reasons  []string        // per gateway, why its last failed probe failed ("": none failed); may be nil
	Dead     []string        // per gateway, the re-check's failure reason ("": not found dead); may be nil
	At       time.Time       // when the probe run finished
	// Held and HoldUntil are the location's hold when this result was made
	// (hold.go), kept with it in the store and the cache file.
	Held      string
	HoldUntil time.Time
}

type entry struct {
	res         *Result // nil until a run has produced one
	epoch       uint64  // the measurement epoch res belongs to
	failed      *Result // the latest run in which no gateway answered, if later than res
	flight      chan struct{}
	started     time.Time // when the run in flight started
	progress    *progress // the run in flight's measurements so far
	retryAt     time.Time // no new run before this, after a run with no result
	lastUsed    time.Time
	view        *Result // res as answered, given the re-check (recheck.go)
	viewOf      *Result // the res view was derived from
	viewVer     uint64  // the deadVer view was derived at
	fromReplica bool    // res was read from the store, not probed here
	pending     bool    // res was probed here and is not the stored result yet (see reconcile)
	token       string  // with pending: the lock token res is published under (claim.unconfirmed)
	hold        holdState
	last        string  // the first choice of the latest answer (Selection.LastServer)
	hitOf       *Result // the result a cache hit was last reported for (Selection.FirstHit)
}

// progress is what a probe run has measured so far, so that a query whose
// wait ends before the run does is answered with the gateways that answered.
// Its fields are written and read with Selector.mu held.
type progress struct {
	gws     []Gateway
	omit    bool
	best    []time.Duration // lowest RTT so far per gateway (0: none yet)
	reasons []string        // per gateway, why its last failed probe failed
}

// Selector answers "which gateways, in which order" per location. It is
// process state: one Selector outlives configuration reloads (see Pool and
// Reconfigure), so its probe runs and cached results are never lost or
// repeated because of a reload.
type Selector struct {
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

	reports *Reports // client reports; own lock, taken after mu

	runs    uint64    // probe runs made by this selector
	lastRun time.Time // when the latest one finished

	storeDown      bool                            // some keys are in trouble (troubles is not empty)
	storeDownUntil time.Time                       // the store rests until then after an error
	troubles       map[StoreKeys]StoreTroubleState // keys the store fails on, until a call on them succeeds

	reportCursor         int64              // ReportStore: changes before this (store clock, ms) are merged
	reportBacklog        map[reportKey]bool // reporters whose write to the ReportStore failed
	reportBacklogDropped uint64             // reporters not queued: the backlog was full
}

// NewSelector returns a selector with defaults filled in.
func NewSelector(cfg Config) (*Selector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.FillDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Selector{now: time.Now, epoch: 1, entries: map[string]*entry{}, dead: map[string]string{}, troubles: map[StoreKeys]StoreTroubleState{}, ctx: ctx, cancel: cancel, saves: make(chan struct{}, 1), reports: NewReports()}
	s.setConfig(cfg)
	return s, nil
}

// setConfig installs cfg; called with s.mu held (or before s is shared).
func (s *Selector) setConfig(cfg Config) {
	s.cfg = cfg
	s.byName = make(map[string]int, len(cfg.Gateways))
	for i, g := range cfg.Gateways {
		s.byName[g.Name] = i
	}
	s.reports.Configure(cfg.Reports, cfg.Gateways, cfg.OmitUnmeasured)
}

// Reports returns the selector's client reports (process state, kept
// across reloads with the selector).
func (s *Selector) Reports() *Reports { return s.reports }

// Config returns the configuration in force, with defaults filled in.
func (s *Selector) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// fresh reports whether e's result answers without a new run at now;
// called with s.mu held.
func (s *Selector) fresh(e *entry, now time.Time) bool {
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
func (s *Selector) Select(ctx context.Context, location string) Selection {
	return s.SelectReported(ctx, location, "")
}

// SelectReported is Select, except that a location whose clients' reports
// (under reportKey, the network the reports came from) are enough answers
// from them, with the re-check's findings applied, and starts no probe run.
func (s *Selector) SelectReported(ctx context.Context, location, reportKey string) Selection {
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
func (s *Selector) afterWait(e *entry, why Why) Selection {
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
func (s *Selector) partial(p *progress) *Result {
	if p == nil || !slices.ContainsFunc(p.best, func(d time.Duration) bool { return d > 0 }) {
		return nil
	}
	res := &Result{Gateways: p.gws, RTTs: slices.Clone(p.best), Reasons: slices.Clone(p.reasons), At: s.now()}
	res.Order = Order(p.gws, res.RTTs, p.omit)
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
func (s *Selector) configured() *Result {
	n := len(s.cfg.Gateways)
	r := &Result{Gateways: s.cfg.Gateways, Order: make([]int, n), RTTs: make([]time.Duration, n)}
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
func (s *Selector) run(location string, e *entry, done chan struct{}, cfg Config, epoch uint64, c *claim) {
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
	var probed *Result
	if any {
		probed = &Result{Gateways: cfg.Gateways, Order: Order(cfg.Gateways, best, cfg.OmitUnmeasured), RTTs: best, Reasons: reasons, At: s.now()}
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
		e.failed = &Result{Gateways: cfg.Gateways, RTTs: best, Reasons: reasons, At: s.now()}
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
func (s *Selector) probeAll(ctx context.Context, location string, cfg Config, prog *progress) (all [][]time.Duration, why [][]string, errs []error) {
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
func (s *Selector) evictIfFull() { s.evictTo(s.cfg.MaxLocations - 1) }

// evictTo drops least recently used locations until at most n remain
// (locations with a probe run in flight stay); called with s.mu held. It
// scans the table, so eviction costs O(n), but only once per new location
// beyond the bound, and a probe run costs far more.
func (s *Selector) evictTo(n int) {
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
func (s *Selector) Forget() {
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
func (s *Selector) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Start begins the background work: saving new results to the cache file,
// watching it for deletion, and re-checking first choices. Call it once, after Load.
func (s *Selector) Start() {
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
// cache file. The Selector answers no more probe runs afterwards.
func (s *Selector) Close() error {
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
