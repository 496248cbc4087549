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
)

// Defaults, from the seed where it has them.
const (
	DefaultBucketWidth = 32 * time.Millisecond
	DefaultHysteresis  = 0.1
	DefaultProbes      = 3
	DefaultInterval    = 10 * time.Second
	DefaultWindow      = 3
	DefaultTimeout     = 2 * time.Second
	DefaultMaxTargets  = 1024
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
	// cross (the seed's client gateway → stitcher leg).
	Segments map[string]time.Duration
	// MaxTargets bounds how many addresses are probed; others stay
	// unmeasured.
	MaxTargets int
	// OnRound, if set, is called after every probe round of a target.
	OnRound func(addr string, r latency.Result)
}

func (c *Config) setDefaults() {
	orDefault(&c.BucketWidth, DefaultBucketWidth)
	orDefault(&c.Probes, DefaultProbes)
	orDefault(&c.Interval, DefaultInterval)
	orDefault(&c.Timeout, DefaultTimeout)
	orDefault(&c.Window, DefaultWindow)
	orDefault(&c.MaxTargets, DefaultMaxTargets)
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
	Addr      string          `json:"address"`
	ID        uint32          `json:"id"`
	Latency   time.Duration   `json:"latency_ns"` // probe minimum over the window + segment
	Probed    time.Duration   `json:"probed_ns"`  // the probe minimum alone
	Segment   time.Duration   `json:"segment_ns"`
	Bucket    int             `json:"bucket"`       // latency.Unmeasured until measured
	Label     string          `json:"bucket_label"` // "[0,32)", "unmeasured", or "all" with NoBuckets
	Measured  bool            `json:"measured"`
	Active    bool            `json:"active"`
	LastRTTs  []time.Duration `json:"last_rtts_ns,omitempty"`
	LastError string          `json:"last_error,omitempty"`
	LastProbe time.Time       `json:"last_probe,omitzero"`
	Rounds    uint64          `json:"rounds"`
}

type target struct {
	addr    string
	id      uint32
	segment time.Duration
	status  atomic.Pointer[Status]
	window  []time.Duration // best RTT of recent successful rounds, newest last
}

// Tracker probes publishers in the background and keeps their status.
type Tracker struct {
	cfg Config

	mu      sync.Mutex
	targets map[string]*target
	byID    atomic.Pointer[[]*target] // copy-on-write, indexed by id
	gen     atomic.Uint64             // bumped when any bucket or activity changes
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
	t := &Tracker{cfg: cfg, targets: map[string]*target{}}
	t.byID.Store(&[]*target{})
	return t, nil
}

// Config returns the tracker's configuration with defaults filled in.
func (t *Tracker) Config() Config { return t.cfg }

// Start begins probing every known target and those added later.
func (t *Tracker) Start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx != nil {
		return
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, tg := range *t.byID.Load() {
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
}

// ErrTooManyTargets is returned by Ensure past Config.MaxTargets.
var ErrTooManyTargets = errors.New("pubsel: too many probe targets")

// Ensure registers addr (host:port) as a target and returns its id. A new
// target starts unmeasured and active; it is probed at once if the tracker
// has started.
func (t *Tracker) Ensure(addr string) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tg, ok := t.targets[addr]; ok {
		return tg.id, nil
	}
	old := *t.byID.Load()
	if len(old) >= t.cfg.MaxTargets {
		return 0, ErrTooManyTargets
	}
	tg := &target{addr: addr, id: uint32(len(old)), segment: t.cfg.Segments[addr]}
	tg.status.Store(&Status{Addr: addr, ID: tg.id, Segment: tg.segment, Bucket: latency.Unmeasured, Label: "unmeasured", Active: true})
	t.targets[addr] = tg
	byID := append(old[:len(old):len(old)], tg)
	t.byID.Store(&byID)
	t.gen.Add(1)
	if t.ctx != nil {
		t.launch(tg)
	}
	return tg.id, nil
}

// Generation changes whenever a target is added or changes bucket or
// activity, so cached selection views know to rebuild.
func (t *Tracker) Generation() uint64 { return t.gen.Load() }

// StatusOf returns the status of target id.
func (t *Tracker) StatusOf(id uint32) *Status {
	byID := *t.byID.Load()
	if int(id) >= len(byID) {
		return nil
	}
	return byID[id].status.Load()
}

// Statuses returns every target's status, in id order.
func (t *Tracker) Statuses() []Status {
	byID := *t.byID.Load()
	out := make([]Status, len(byID))
	for i, tg := range byID {
		out[i] = *tg.status.Load()
	}
	return out
}

func (t *Tracker) launch(tg *target) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tick := time.NewTicker(t.cfg.Interval)
		defer tick.Stop()
		for {
			t.Round(t.ctx, tg.id)
			select {
			case <-t.ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// Round runs one probe round for target id now and records it.
func (t *Tracker) Round(ctx context.Context, id uint32) {
	byID := *t.byID.Load()
	if int(id) >= len(byID) {
		return
	}
	tg := byID[id]
	r := latency.Measure(ctx, t.cfg.Prober, tg.addr, t.cfg.Probes, t.cfg.Timeout)
	if ctx.Err() != nil {
		return // stopping: a cancelled round says nothing about the target
	}
	t.record(tg, r, time.Now())
	if t.cfg.OnRound != nil {
		t.cfg.OnRound(tg.addr, r)
	}
}

// record folds one round into the target's status. Only the target's own
// prober goroutine (or a test) calls it, so window needs no lock.
func (t *Tracker) record(tg *target, r latency.Result, now time.Time) {
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
		if len(tg.window) > t.cfg.Window {
			tg.window = tg.window[len(tg.window)-t.cfg.Window:]
		}
		best := tg.window[0]
		for _, d := range tg.window[1:] {
			best = min(best, d)
		}
		st.Probed, st.Latency, st.Measured = best, best+tg.segment, true
		if t.cfg.NoBuckets {
			st.Bucket, st.Label = 0, "all"
		} else {
			st.Bucket = latency.Rebucket(prev.Bucket, st.Latency, t.cfg.BucketWidth, t.cfg.Hysteresis)
			if st.Bucket != prev.Bucket {
				st.Label = latency.Label(st.Bucket, t.cfg.BucketWidth)
			}
		}
	}
	tg.status.Store(&st)
	if st.Active != prev.Active || st.Bucket != prev.Bucket {
		t.gen.Add(1)
	}
}
