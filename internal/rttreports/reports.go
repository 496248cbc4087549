// Package rttreports aggregates client reports of gateway RTTs per location
// (a median per gateway over distinct reporters, bounded tables), decodes
// and encodes the report's JSON, and shares votes between replicas through a
// VoteStore. It knows nothing of CoreDNS or HTTP.
package rttreports

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// Client reports. Probes from the DNS server measure from the DNS
// server's network; in an authoritative deployment every location would get
// that one view. Reports carry what clients measured from their own network
// with the same rule (lowest of a few probes per gateway). A location's
// order is taken from its reports once enough distinct reporters have sent
// fresh ones; until then the selector's own probes decide.
//
// The aggregation is chosen to resist a few bad reporters: a reporter is
// one vote however often it reports (its latest RTT per gateway counts),
// and a gateway's RTT is the median of the votes, a failure counting as an
// infinitely slow vote. A gateway with fewer votes than MinReporters counts
// as unmeasured, so one reporter alone can never promote a gateway nobody
// else measured. Liars move the median only once they are about half of the
// reporters of that location.

// Defaults and limits of reports.
const (
	DefaultWindow       = 4 * time.Hour
	DefaultMinReporters = 3
	DefaultMaxLocations = 10_000
	DefaultMaxReporters = 32 // per location
	// DefaultMaxTokenReporters bounds one token's reporters in a location:
	// a few reporters of one office sharing a token all count, and a token
	// with many addresses (an IPv6 /56 holds 256 /64s) counts that many at
	// most.
	DefaultMaxTokenReporters = 4
	// MaxReportRTT bounds a reported RTT: (0, MaxReportRTT) is accepted.
	MaxRTT = time.Hour
	// ReportClockSkew is how far in the future a report's time may be
	// (reporters' clocks are not ours).
	ClockSkew = time.Minute
)

// Config configures the reports; the zero value is off.
type Config struct {
	Enabled      bool
	Window       time.Duration // a vote counts this long after it was measured
	MinReporters int           // distinct reporters needed for a location, and votes for a gateway
	MaxLocations int           // locations with reports, at most
	MaxReporters int           // reporters per location, at most
	// MaxTokenReporters bounds the reporters of one token in a location (a
	// reporter is "TOKEN_ID|NETWORK"; see ReporterToken).
	MaxTokenReporters int
	// Probe, if set, is the only probe kind accepted ("https", "tcp" ...),
	// so reports are comparable with each other.
	Probe string
}

// FillDefaults sets unset fields to their defaults.
func (c *Config) FillDefaults() {
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.MinReporters = cmp.Or(c.MinReporters, DefaultMinReporters)
	c.MaxLocations = cmp.Or(c.MaxLocations, DefaultMaxLocations)
	c.MaxReporters = cmp.Or(c.MaxReporters, DefaultMaxReporters)
	c.MaxTokenReporters = cmp.Or(c.MaxTokenReporters, DefaultMaxTokenReporters)
}

// Validate names the bad option. It runs before FillDefaults, so the
// bounds are compared as they will apply: an unset one by its default.
func (c *Config) Validate() error {
	d := *c
	d.FillDefaults()
	switch {
	case c.Window < 0:
		return fmt.Errorf("report_window %v: must be positive", c.Window)
	case c.MinReporters < 0:
		return fmt.Errorf("min_reporters %d: must be at least 1", c.MinReporters)
	case c.MaxLocations < 0:
		return fmt.Errorf("max_report_locations %d: must be positive", c.MaxLocations)
	case c.MaxReporters < 0:
		return fmt.Errorf("max_reporters %d: must be positive", c.MaxReporters)
	case c.MaxTokenReporters < 0:
		return fmt.Errorf("max_reporters_per_token %d: must be positive", c.MaxTokenReporters)
	case d.MinReporters > d.MaxReporters:
		return fmt.Errorf("min_reporters %d%s: above max_reporters %d%s (no location could ever answer from reports)",
			d.MinReporters, defaulted(c.MinReporters), d.MaxReporters, defaulted(c.MaxReporters))
	}
	return nil
}

// defaulted marks a value Validate took from the defaults.
func defaulted(given int) string {
	if given == 0 {
		return " (the default)"
	}
	return ""
}

// Measurement is one gateway's result in a report.
type Measurement struct {
	Gateway string
	RTT     time.Duration // lowest of the reporter's probes; with Failed, ignored
	Failed  bool          // no probe succeeded
}

// Report is what one reporter measured in one run.
type Report struct {
	Probe        string
	At           time.Time // when it measured
	Measurements []Measurement
}

// Refusal is why a report was refused; Reason is a short stable word for
// metrics and clients, Detail says which value.
type Refusal struct {
	Reason string // malformed, unknown_gateway, rtt_out_of_range, future, stale, duplicate_gateway, empty, probe_mismatch, disabled
	Detail string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Detail }

// ReportReasons lists every Refusal reason.
var RefusalReasons = []string{"malformed", "unknown_gateway", "rtt_out_of_range", "future", "stale", "duplicate_gateway", "empty", "probe_mismatch", "disabled"}

type vote struct {
	rtt time.Duration // math.MaxInt64: failed
	at  time.Time
}

type reporterState struct {
	votes  map[string]vote // gateway name → latest vote
	latest time.Time
}

type reportLocation struct {
	reporters map[string]*reporterState
	latest    time.Time
	agg       *gatewayorder.Result // nil: recompute
	aggN      int                  // reporters counted in agg
	aggUntil  time.Time
}

// Reports holds the client reports per location and their aggregates.
type Reports struct {
	mu   sync.Mutex
	cfg  Config
	gws  []gatewayorder.Gateway
	idx  map[string]int
	omit bool
	locs map[string]*reportLocation

	accepted uint64
}

// NewReports returns an empty table.
func NewReports() *Reports { return &Reports{locs: map[string]*reportLocation{}} }

// Configure applies cfg and the gateways in force; every aggregate is
// recomputed on its next use, and tables above the new bounds are trimmed.
func (r *Reports) Configure(cfg Config, gws []gatewayorder.Gateway, omit bool) {
	cfg.FillDefaults()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cfg, r.gws, r.omit = cfg, gws, omit
	r.idx = make(map[string]int, len(gws))
	for i, g := range gws {
		r.idx[g.Name] = i
	}
	for _, l := range r.locs {
		l.agg = nil
		for len(l.reporters) > cfg.MaxReporters {
			evictOldestReporter(l, busiestToken(l, ""))
		}
	}
	for len(r.locs) > cfg.MaxLocations {
		r.evictOldestLocation()
	}
}

// Enabled reports whether reports are on.
func (r *Reports) Enabled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Enabled
}

// Add records rep from reporter (its identity: token id × source network)
// for location, or refuses it whole with a *Refusal.
func (r *Reports) Add(location, reporter string, rep Report, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.cfg.Enabled {
		return &Refusal{"disabled", "reports are not enabled"}
	}
	if len(rep.Measurements) == 0 {
		return &Refusal{"empty", "no gateway measured"}
	}
	if r.cfg.Probe != "" && rep.Probe != r.cfg.Probe {
		return &Refusal{"probe_mismatch", fmt.Sprintf("probe %q: this server compares %q measurements", rep.Probe, r.cfg.Probe)}
	}
	switch {
	case rep.At.After(now.Add(ClockSkew)):
		return &Refusal{"future", fmt.Sprintf("time %s is %v ahead of this server's clock", rep.At.UTC().Format(time.RFC3339), rep.At.Sub(now).Round(time.Second))}
	case !now.Before(rep.At.Add(r.cfg.Window)):
		return &Refusal{"stale", fmt.Sprintf("time %s is older than report_window %v", rep.At.UTC().Format(time.RFC3339), r.cfg.Window)}
	}
	seen := make(map[string]bool, len(rep.Measurements))
	for _, m := range rep.Measurements {
		if _, ok := r.idx[m.Gateway]; !ok {
			return &Refusal{"unknown_gateway", fmt.Sprintf("gateway %q is not configured", m.Gateway)}
		}
		if seen[m.Gateway] {
			return &Refusal{"duplicate_gateway", fmt.Sprintf("gateway %q given twice", m.Gateway)}
		}
		seen[m.Gateway] = true
		if !m.Failed && (m.RTT <= 0 || m.RTT >= MaxRTT) {
			return &Refusal{"rtt_out_of_range", fmt.Sprintf("gateway %q: rtt %v outside (0, %v)", m.Gateway, m.RTT, MaxRTT)}
		}
	}
	at := rep.At
	if at.After(now) {
		at = now // a vote never outlives its window because of a fast clock
	}
	l := r.location(location)
	st := r.reporter(l, reporter)
	for _, m := range rep.Measurements {
		if old, ok := st.votes[m.Gateway]; ok && old.at.After(at) {
			continue // an older run arriving late does not replace a newer vote
		}
		v := vote{rtt: m.RTT, at: at}
		if m.Failed {
			v.rtt = math.MaxInt64
		}
		st.votes[m.Gateway] = v
	}
	if at.After(st.latest) {
		st.latest = at
	}
	if at.After(l.latest) {
		l.latest = at
	}
	l.agg = nil
	r.accepted++
	return nil
}

// evictOldestLocation drops the location whose newest report is oldest;
// called with r.mu held. O(locations), once per new location beyond the
// bound.
func (r *Reports) evictOldestLocation() {
	var victim string
	var oldest time.Time
	for k, l := range r.locs {
		if victim == "" || l.latest.Before(oldest) {
			victim, oldest = k, l.latest
		}
	}
	delete(r.locs, victim)
}

// Order returns location's order from its reports and the number of
// distinct reporters counted, or ok false when the location has fewer than
// MinReporters reporters with a vote inside the window, or no gateway with
// enough votes (the caller's own probes decide then). The aggregate is
// kept until a report arrives, the configuration changes or a counted vote
// leaves the window.
func (r *Reports) Order(location string, now time.Time) (res *gatewayorder.Result, reporters int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.cfg.Enabled {
		return nil, 0, false
	}
	l := r.locs[location]
	if l == nil {
		return nil, 0, false
	}
	if l.agg == nil || !now.Before(l.aggUntil) {
		r.aggregate(location, l, now)
	}
	if l.agg == nil || len(l.agg.Order) == 0 {
		return nil, l.aggN, false
	}
	return l.agg, l.aggN, true
}

// aggregate computes l's medians; called with r.mu held. Reporters whose
// every vote left the window are dropped, and so is a location left empty.
func (r *Reports) aggregate(location string, l *reportLocation, now time.Time) {
	n := len(r.gws)
	votes := make([][]time.Duration, n)
	until := now.Add(r.cfg.Window)
	counted := 0
	for id, st := range l.reporters {
		fresh := false
		for name, v := range st.votes {
			exp := v.at.Add(r.cfg.Window)
			i, known := r.idx[name]
			if !now.Before(exp) || !known {
				delete(st.votes, name)
				continue
			}
			fresh = true
			votes[i] = append(votes[i], v.rtt)
			if exp.Before(until) {
				until = exp
			}
		}
		if !fresh {
			delete(l.reporters, id)
			continue
		}
		counted++
	}
	l.aggN, l.aggUntil, l.agg = counted, until, &gatewayorder.Result{Gateways: r.gws, RTTs: make([]time.Duration, n), At: l.latest}
	if len(l.reporters) == 0 {
		delete(r.locs, location)
		l.agg = nil
		return
	}
	if counted < r.cfg.MinReporters {
		l.agg.Order = nil
		return
	}
	any := false
	for i, vs := range votes {
		if len(vs) < r.cfg.MinReporters {
			continue
		}
		if m := Median(vs); m < math.MaxInt64 {
			l.agg.RTTs[i], any = m, true
		}
	}
	if any {
		l.agg.Order = gatewayorder.Order(r.gws, l.agg.RTTs, r.omit)
	}
}

// Median returns the median of vs (the mean of the middle two of an even
// count; math.MaxInt64 when that touches a failed vote). vs is reordered.
func Median(vs []time.Duration) time.Duration {
	slices.Sort(vs)
	k := len(vs) / 2
	if len(vs)%2 == 1 {
		return vs[k]
	}
	a, b := vs[k-1], vs[k]
	if b == math.MaxInt64 {
		return b
	}
	return a + (b-a)/2
}

// ReportLocationState is one location's reports, for an admin view.
type LocationState struct {
	Location  string
	Reporters int                  // distinct reporters with a vote inside the window
	Latest    time.Time            // the newest report's time
	Result    *gatewayorder.Result // the order from reports; nil: not enough reporters
}

// ReportSnapshot is the reports' state.
type Snapshot struct {
	Enabled   bool
	Config    Config
	Locations []LocationState // newest first, at most the limit asked for
	Total     int             // locations with reports
	Accepted  uint64          // reports accepted since start (across reloads)
}

// Snapshot returns the reports' state with at most limit locations.
func (r *Reports) Snapshot(limit int, now time.Time) Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	snap := Snapshot{Enabled: r.cfg.Enabled, Config: r.cfg, Accepted: r.accepted}
	for k, l := range r.locs {
		if l.agg == nil || !now.Before(l.aggUntil) {
			r.aggregate(k, l, now)
		}
		if r.locs[k] == nil {
			continue
		}
		st := LocationState{Location: k, Reporters: l.aggN, Latest: l.latest}
		if l.agg != nil && len(l.agg.Order) > 0 {
			st.Result = l.agg
		}
		snap.Locations = append(snap.Locations, st)
	}
	snap.Total = len(snap.Locations)
	slices.SortFunc(snap.Locations, func(a, b LocationState) int {
		if c := b.Latest.Compare(a.Latest); c != 0 {
			return c
		}
		if a.Location < b.Location {
			return -1
		}
		return 1
	})
	if len(snap.Locations) > limit {
		snap.Locations = snap.Locations[:limit]
	}
	return snap
}

// Firsts returns the first gateway of every location answered from reports
// (for the re-check).
func (r *Reports) Firsts(now time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := map[string]bool{}
	for k, l := range r.locs {
		if l.agg == nil || !now.Before(l.aggUntil) {
			r.aggregate(k, l, now)
		}
		if l.agg != nil && len(l.agg.Order) > 0 && r.locs[k] != nil {
			set[l.agg.Gateways[l.agg.Order[0]].Name] = true
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	return out
}

// Len returns the locations holding reports (some may hold only votes past
// the window, until their next aggregation).
func (r *Reports) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.locs)
}

// location returns location's reports, made (the oldest location evicted
// past MaxLocations) if there are none.
func (r *Reports) location(location string) *reportLocation {
	l := r.locs[location]
	if l == nil {
		for len(r.locs) >= r.cfg.MaxLocations {
			r.evictOldestLocation()
		}
		l = &reportLocation{reporters: map[string]*reporterState{}}
		r.locs[location] = l
	}
	return l
}

// reporter returns reporter's votes in l, made if there are none. A new
// reporter of a token already holding MaxTokenReporters there replaces that
// token's least recent one; in a full location (MaxReporters) it replaces
// the least recent reporter of the token holding most reporters there, its
// own token counted with the newcomer. So a token with many addresses
// pushes out its own reporters, never those of tokens with fewer.
func (r *Reports) reporter(l *reportLocation, reporter string) *reporterState {
	st := l.reporters[reporter]
	if st == nil {
		token := ReporterToken(reporter)
		for r.tokenReporters(l, token) >= r.cfg.MaxTokenReporters {
			evictOldestReporter(l, token)
		}
		for len(l.reporters) >= r.cfg.MaxReporters {
			evictOldestReporter(l, busiestToken(l, token))
		}
		st = &reporterState{votes: map[string]vote{}}
		l.reporters[reporter] = st
	}
	return st
}
