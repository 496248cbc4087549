package ogs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// Defaults, from the seed.
const (
	DefaultProbes       = 3
	DefaultDeadline     = 7 * time.Second
	DefaultCacheTTL     = 14 * 24 * time.Hour
	DefaultRetry        = time.Minute
	DefaultMaxLocations = 100_000
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
	Deadline       time.Duration // a whole probe run, and the longest a query waits
	CacheTTL       time.Duration // how long a location's result stands
	Retry          time.Duration // after a run with no result, wait this long before the next
	OmitUnmeasured bool
	MaxLocations   int
	// CacheFile, if set, keeps results across restarts (see Start).
	CacheFile string
	// Recheck is how often each cached first choice is probed once in the
	// background (see recheck.go); negative: never.
	Recheck time.Duration
	// OnRecheck, if set, is called after each re-check probe.
	OnRecheck func(Recheck)
	// OnRun, if set, is called after every probe run with its results.
	OnRun func(Run)
	// OnError, if set, gets background errors (saving the cache file).
	OnError func(error)
}

// Run is one finished probe run, as reported to Config.OnRun.
type Run struct {
	Location string
	Gateways []Gateway
	RTTs     [][]time.Duration // per gateway, every probe (0: failed)
	Reasons  [][]string        // per gateway, every probe's failure reason ("": succeeded)
	Errors   []error           // per gateway, its last failed probe's error (nil: none failed)
	Result   *Result           // nil when no gateway answered
	Previous *Result           // without Result: the location's earlier result, if any
	RetryAt  time.Time         // without Result: no new run before this
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
		for _, b := range g.Backups {
			if !seen[b] {
				return fmt.Errorf("gateway %s: backup %q is not a configured gateway", g.Name, b)
			}
		}
	}
	switch {
	case c.Probes < 0:
		return fmt.Errorf("probes %d: must be at least 1", c.Probes)
	case c.Deadline < 0:
		return fmt.Errorf("deadline %v: must be positive", c.Deadline)
	case c.CacheTTL < 0:
		return fmt.Errorf("cache_ttl %v: must be positive", c.CacheTTL)
	case c.MaxLocations < 0:
		return fmt.Errorf("max_locations %d: must be positive", c.MaxLocations)
	}
	return nil
}

// FillDefaults sets every unset field to its default.
func (c *Config) FillDefaults() {
	if c.Prober == nil {
		c.Prober = latency.TCPProber{}
	}
	if c.Probes == 0 {
		c.Probes = DefaultProbes
	}
	if c.Deadline == 0 {
		c.Deadline = DefaultDeadline
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.Retry == 0 {
		c.Retry = DefaultRetry
	}
	if c.MaxLocations == 0 {
		c.MaxLocations = DefaultMaxLocations
	}
	if c.Recheck == 0 {
		c.Recheck = DefaultRecheck
	}
}

// Source says where an answer's order came from.
type Source int

const (
	Probed     Source = iota // a probe run that finished within this query's wait
	Cached                   // a location entry still inside its lifetime
	Previous                 // no fresh result (see Why): the location's previous selection
	Configured               // no fresh result and none before: the configured order
)

func (s Source) String() string {
	return [...]string{"probed", "cache", "previous", "configured"}[s]
}

// Why says why a Previous or Configured selection answered.
type Why int

const (
	WhyNone      Why = iota
	WhyDeadline      // the probe run was still going when the query's wait ended
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
}

type entry struct {
	res      *Result // nil until a run has produced one
	epoch    uint64  // the measurement epoch res belongs to
	failed   *Result // the latest run in which no gateway answered, if later than res
	flight   chan struct{}
	retryAt  time.Time // no new run before this, after a run with no result
	lastUsed time.Time
	view     *Result // res as answered, given the re-check (recheck.go)
	viewOf   *Result // the res view was derived from
	viewVer  uint64  // the deadVer view was derived at
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
}

// NewSelector returns a selector with defaults filled in.
func NewSelector(cfg Config) (*Selector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.FillDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Selector{now: time.Now, epoch: 1, entries: map[string]*entry{}, dead: map[string]string{}, ctx: ctx, cancel: cancel, saves: make(chan struct{}, 1)}
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
}

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
// caller waits for it until the deadline; past that, or when no gateway
// answered, it gets the previous selection, or the configured order.
func (s *Selector) Select(ctx context.Context, location string) Selection {
	now := s.now()
	s.mu.Lock()
	e := s.entries[location]
	if e == nil {
		e = &entry{}
		s.evictIfFull()
		s.entries[location] = e
	}
	e.lastUsed = now
	if s.fresh(e, now) {
		res := s.answered(e)
		s.mu.Unlock()
		return Selection{Result: res, Source: Cached}
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
		e.flight = flight
		s.wg.Add(1)
		go s.run(location, e, flight, s.cfg, s.epoch)
	}
	deadline := s.cfg.Deadline
	s.mu.Unlock()

	if why != WhyClosed && why != WhyRetryWait {
		timer := time.NewTimer(deadline)
		defer timer.Stop()
		select {
		case <-flight:
			s.mu.Lock()
			fresh, res := s.fresh(e, s.now()), s.answered(e)
			s.mu.Unlock()
			if fresh {
				return Selection{Result: res, Source: Probed}
			}
			why = WhyNoAnswer
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sel := Selection{Why: why, Failed: e.failed, RetryAt: e.retryAt, Result: s.answered(e), Source: Previous}
	if sel.Result == nil {
		sel.Result, sel.Source = s.configured(), Configured
	}
	return sel
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

// run probes every gateway of cfg in parallel, bounded by the deadline, and
// stores the result unless nothing answered. cfg and epoch are those in
// force when the run started; a reload during the run maps its result onto
// the new configuration by gateway name (see Reconfigure).
func (s *Selector) run(location string, e *entry, done chan struct{}, cfg Config, epoch uint64) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, cfg.Deadline)
	defer cancel()
	n := len(cfg.Gateways)
	all := make([][]time.Duration, n)
	why := make([][]string, n)
	errs := make([]error, n)
	best := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i, g := range cfg.Gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			all[i] = make([]time.Duration, 0, cfg.Probes)
			for range cfg.Probes {
				r := latency.Measure(ctx, cfg.Prober, g.Addr, 1, cfg.Deadline)
				all[i] = append(all[i], r.Best)
				why[i] = append(why[i], Reason(r.Err))
				if r.OK == 0 {
					errs[i] = r.Err
				} else if best[i] == 0 || r.Best < best[i] {
					best[i] = r.Best
				}
				if ctx.Err() != nil {
					break
				}
			}
		}()
	}
	wg.Wait()
	reasons := make([]string, n)
	any := false
	for i := range best {
		any = any || best[i] > 0
		reasons[i] = Reason(errs[i])
	}
	s.mu.Lock()
	var res *Result
	if any {
		res = &Result{Gateways: cfg.Gateways, Order: Order(cfg.Gateways, best, cfg.OmitUnmeasured), RTTs: best, Reasons: reasons, At: s.now()}
		if !sameGateways(cfg.Gateways, s.cfg.Gateways) || cfg.OmitUnmeasured != s.cfg.OmitUnmeasured {
			res = s.remap(res)
		}
	}
	switch {
	case res != nil:
		e.res, e.epoch, e.failed = res, epoch, nil
	case !any:
		e.retryAt = s.now().Add(cfg.Retry)
		e.failed = &Result{Gateways: cfg.Gateways, RTTs: best, Reasons: reasons, At: s.now()}
	}
	e.flight = nil
	run := Run{Location: location, Gateways: cfg.Gateways, RTTs: all, Reasons: why, Errors: errs, Result: res, RetryAt: e.retryAt}
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
// probes again (the seed's "delete the preferences file").
func (s *Selector) Forget() {
	s.mu.Lock()
	for loc, e := range s.entries {
		if e.flight == nil {
			delete(s.entries, loc)
		} else {
			e.res = nil
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
	s.wg.Add(2)
	go s.recheck()
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
