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
	Result   *Result           // nil when no gateway answered
	Previous bool              // the location still has an earlier result
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
}

// Source says where an answer's order came from.
type Source int

const (
	Probed     Source = iota // a probe run that finished within this query's wait
	Cached                   // a location entry still inside its lifetime
	Previous                 // the deadline passed: the location's previous selection
	Configured               // the deadline passed and the location had none: config order
)

func (s Source) String() string {
	return [...]string{"probed", "cache", "previous", "configured"}[s]
}

// Result is one location's selection. It is never modified once made, so
// an answer being written may keep using it while a reload replaces it.
type Result struct {
	Gateways []Gateway       // the configuration the indices below refer to
	Order    []int           // gateway indices, best first
	RTTs     []time.Duration // lowest RTT per gateway (0: no successful probe)
	At       time.Time       // when the probe run finished
}

type entry struct {
	res      *Result // nil until a run has produced one
	epoch    uint64  // the measurement epoch res belongs to
	flight   chan struct{}
	retryAt  time.Time // no new run before this, after a run with no result
	lastUsed time.Time
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
	s := &Selector{now: time.Now, epoch: 1, entries: map[string]*entry{}, ctx: ctx, cancel: cancel, saves: make(chan struct{}, 1)}
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
// at a time) and the caller waits for it until the deadline; past that it
// gets the previous selection, or the configured order.
func (s *Selector) Select(ctx context.Context, location string) (*Result, Source) {
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
		res := e.res
		s.mu.Unlock()
		return res, Cached
	}
	flight := e.flight
	if flight == nil && !now.Before(e.retryAt) && !s.closed {
		flight = make(chan struct{})
		e.flight = flight
		s.wg.Add(1)
		go s.run(location, e, flight, s.cfg, s.epoch)
	}
	deadline := s.cfg.Deadline
	s.mu.Unlock()

	if flight != nil {
		timer := time.NewTimer(deadline)
		defer timer.Stop()
		select {
		case <-flight:
			s.mu.Lock()
			fresh, res := s.fresh(e, s.now()), e.res
			s.mu.Unlock()
			if fresh {
				return res, Probed
			}
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.res != nil {
		return e.res, Previous
	}
	return s.configured(), Configured
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
	all := make([][]time.Duration, len(cfg.Gateways))
	best := make([]time.Duration, len(cfg.Gateways))
	var wg sync.WaitGroup
	for i, g := range cfg.Gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := latency.Measure(ctx, cfg.Prober, g.Addr, cfg.Probes, cfg.Deadline)
			all[i] = r.RTTs
			if r.OK > 0 {
				best[i] = r.Best
			}
		}()
	}
	wg.Wait()
	any := false
	for _, b := range best {
		any = any || b > 0
	}
	s.mu.Lock()
	var res *Result
	if any {
		res = &Result{Gateways: cfg.Gateways, Order: Order(cfg.Gateways, best, cfg.OmitUnmeasured), RTTs: best, At: s.now()}
		if !sameGateways(cfg.Gateways, s.cfg.Gateways) || cfg.OmitUnmeasured != s.cfg.OmitUnmeasured {
			res = s.remap(res)
		}
	}
	switch {
	case res != nil:
		e.res, e.epoch = res, epoch
	case !any:
		e.retryAt = s.now().Add(cfg.Retry)
	}
	e.flight = nil
	previous := e.res != nil
	onRun := s.cfg.OnRun
	s.mu.Unlock()
	close(done)
	if onRun != nil {
		onRun(Run{Location: location, Gateways: cfg.Gateways, RTTs: all, Result: res, Previous: previous})
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

// Start begins the background work: saving new results to the cache file
// and watching it for deletion. Call it once, after Load.
func (s *Selector) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return
	}
	s.started = true
	s.wg.Add(1)
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
