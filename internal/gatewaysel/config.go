package gatewaysel

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/rttreports"
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

// Config configures a Table. A running Table takes a new one through
// Reconfigure (a reload).
type Config struct {
	Gateways []gatewayorder.Gateway
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
	OnProbeStart func(location string, g gatewayorder.Gateway)
	// OnError, if set, gets background errors (saving the cache file).
	OnError func(error)

	// Store, if set, is a cache level shared with other replicas (see
	// resultstore.go); StoreTimeout bounds each call, StorePoll is how often a
	// replica waiting on another's probe run looks for its result, and
	// StoreRetry how long the store rests after an error.
	Store        ResultStore
	StoreTimeout time.Duration
	StorePoll    time.Duration
	StoreRetry   time.Duration
	// OnStore, if set, is told what happened with the store.
	OnStore func(StoreEvent)
	// ReportStore, if set, shares client reports with other replicas
	// (reportsync.go), within StoreTimeout per call.
	ReportStore rttreports.VoteStore

	// Reports, when enabled, orders a location from its clients' reports
	// (rttreports) once enough of them report.
	Reports rttreports.Config
}

// Run is one finished probe run, as reported to Config.OnRun.
type Run struct {
	Location    string
	Gateways    []gatewayorder.Gateway
	RTTs        [][]time.Duration    // per gateway, every probe (0: failed)
	Reasons     [][]string           // per gateway, every probe's failure reason ("": succeeded)
	Errors      []error              // per gateway, its last failed probe's error (nil: none failed)
	Result      *gatewayorder.Result // what the location answers: nil when no gateway answered
	FromReplica bool                 // Result is another replica's, stored first (this run lost the race)
	Previous    *gatewayorder.Result // without Result: the location's earlier result, if any
	RetryAt     time.Time            // without Result: no new run before this
	LastServer  string               // the first choice of the location's latest answer ("": none)
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
	c.Probes = cmp.Or(c.Probes, DefaultProbes)
	c.Deadline = cmp.Or(c.Deadline, DefaultDeadline)
	c.ProbeTimeout = cmp.Or(c.ProbeTimeout, DefaultProbeTimeout)
	c.ProbeSpacing = cmp.Or(c.ProbeSpacing, DefaultProbeSpacing)
	c.AnswerDeadline = cmp.Or(c.AnswerDeadline, DefaultAnswerDeadline)
	c.CacheTTL = cmp.Or(c.CacheTTL, DefaultCacheTTL)
	c.Retry = cmp.Or(c.Retry, DefaultRetry)
	c.MaxLocations = cmp.Or(c.MaxLocations, DefaultMaxLocations)
	c.Recheck = cmp.Or(c.Recheck, DefaultRecheck)
	c.Hold = cmp.Or(c.Hold, DefaultHold)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.StorePoll = cmp.Or(c.StorePoll, DefaultStorePoll)
	c.StoreRetry = cmp.Or(c.StoreRetry, DefaultStoreRetry)
	c.Reports.FillDefaults()
}
