package ogs

import (
	"context"
	"errors"
	"fmt"
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

// Config configures a Selector.
type Config struct {
	Gateways       []Gateway
	Prober         latency.Prober
	Probes         int           // per gateway per run
	Deadline       time.Duration // a whole probe run, and the longest a query waits
	CacheTTL       time.Duration // how long a location's result stands
	Retry          time.Duration // after a run with no result, wait this long before the next
	OmitUnmeasured bool
	MaxLocations   int
	// OnRun, if set, is called after every probe run with its results.
	OnRun func(location string, rtts [][]time.Duration)
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

// Result is one location's selection.
type Result struct {
	Order []int           // gateway indices, best first
	RTTs  []time.Duration // lowest RTT per gateway (0: no successful probe)
	At    time.Time       // when the probe run finished
}

type entry struct {
	res      *Result // nil until a run has produced one
	flight   chan struct{}
	retryAt  time.Time // no new run before this, after a run with no result
	lastUsed time.Time
}

// Selector answers "which gateways, in which order" per location.
type Selector struct {
	cfg Config
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*entry
	onStore func() // persistence hook
}

// NewSelector returns a selector with defaults filled in.
func NewSelector(cfg Config) (*Selector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prober == nil {
		cfg.Prober = latency.TCPProber{}
	}
	if cfg.Probes == 0 {
		cfg.Probes = DefaultProbes
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.Retry == 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.MaxLocations == 0 {
		cfg.MaxLocations = DefaultMaxLocations
	}
	return &Selector{cfg: cfg, now: time.Now, entries: map[string]*entry{}}, nil
}

// Config returns the configuration with defaults filled in.
func (s *Selector) Config() Config { return s.cfg }

// Select returns the order for location. A fresh cached result answers at
// once. Otherwise one probe run starts for the location (never more than one
// at a time) and the caller waits for it until the deadline, measured from
// the run's start; past that it gets the previous selection, or the
// configured order.
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
	if e.res != nil && now.Sub(e.res.At) < s.cfg.CacheTTL {
		res := e.res
		s.mu.Unlock()
		return res, Cached
	}
	flight := e.flight
	if flight == nil && !now.Before(e.retryAt) {
		flight = make(chan struct{})
		e.flight = flight
		go s.run(location, e, flight)
	}
	s.mu.Unlock()

	if flight != nil {
		timer := time.NewTimer(s.cfg.Deadline)
		defer timer.Stop()
		select {
		case <-flight:
			s.mu.Lock()
			res := e.res
			s.mu.Unlock()
			if res != nil && s.now().Sub(res.At) < s.cfg.CacheTTL {
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

func (s *Selector) configured() *Result {
	r := &Result{Order: make([]int, len(s.cfg.Gateways)), RTTs: make([]time.Duration, len(s.cfg.Gateways))}
	for i := range r.Order {
		r.Order[i] = i
	}
	return r
}

// run probes every gateway in parallel, bounded by the deadline, and stores
// the result unless nothing answered.
func (s *Selector) run(location string, e *entry, done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Deadline)
	defer cancel()
	all := make([][]time.Duration, len(s.cfg.Gateways))
	best := make([]time.Duration, len(s.cfg.Gateways))
	var wg sync.WaitGroup
	for i, g := range s.cfg.Gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := latency.Measure(ctx, s.cfg.Prober, g.Addr, s.cfg.Probes, s.cfg.Deadline)
			all[i] = r.RTTs
			if r.OK > 0 {
				best[i] = r.Best
			}
		}()
	}
	wg.Wait()
	if s.cfg.OnRun != nil {
		s.cfg.OnRun(location, all)
	}
	any := false
	for _, b := range best {
		any = any || b > 0
	}
	s.mu.Lock()
	if any {
		e.res = &Result{Order: Order(s.cfg.Gateways, best, s.cfg.OmitUnmeasured), RTTs: best, At: s.now()}
	} else {
		e.retryAt = s.now().Add(s.cfg.Retry)
	}
	e.flight = nil
	store := s.onStore
	s.mu.Unlock()
	close(done)
	if any && store != nil {
		store()
	}
}

// evictIfFull drops the least recently used location; called with s.mu held.
// It scans the table, so eviction costs O(n), but only once per new location
// beyond the bound, and a probe run costs far more.
func (s *Selector) evictIfFull() {
	if len(s.entries) < s.cfg.MaxLocations {
		return
	}
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
	if victim != "" {
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
