package pubsel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/sticky"
)

// Settings is everything that configures one policy's State.
type Settings struct {
	Tracker Config
	// Sticky turns the table on; off, it is emptied (and left unused).
	Sticky           bool
	StickyTTL        time.Duration
	StickyMaxEntries int
	// StickyStore, with Sticky, makes a shared store the table's second level
	// (a cluster of replicas sharing pins); nil: local only.
	StickyStore *StickyStoreConfig
}

func (s *Settings) setDefaults() { orDefault(&s.StickyMaxEntries, DefaultStickyMaxEntries) }

func (s Settings) same(o Settings) bool {
	return sameSettings(s.Tracker, o.Tracker) && s.Sticky == o.Sticky &&
		s.StickyTTL == o.StickyTTL && s.StickyMaxEntries == o.StickyMaxEntries && sameStickyStore(s.StickyStore, o.StickyStore)
}

func sameStickyStore(a, b *StickyStoreConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.setDefaults()
	y.setDefaults()
	return x.Store == y.Store && x.Name == y.Name && x.Prefix == y.Prefix && x.Timeout == y.Timeout && x.Recheck == y.Recheck &&
		x.DownFailures == y.DownFailures && x.DownAfter == y.DownAfter && x.RefusalHold == y.RefusalHold
}

// State is the process-lifetime state of one named policy: the tracker
// (targets, their probers and measurement windows) and the sticky table.
// Config generations come and go; each takes a Lease, and the state lives
// until the owner of the State (the adapter's pool) closes it.
type State struct {
	tracker *Tracker
	table   *sticky.Table
	since   time.Time
	clock   atomic.Int64 // coarse unix ns, for the sticky table
	cancel  context.CancelFunc
	done    chan struct{}

	stickyStore      atomic.Pointer[StickyStore] // nil: no shared level
	stickyStoreStats StickyStoreStats

	mu       sync.Mutex
	leases   []*Lease // in arrival order; the last one's settings are in force
	settings Settings
}

// Clock granularity and how often idle sticky entries are swept.
const (
	clockTick     = 250 * time.Millisecond
	sweepInterval = time.Minute
)

// DefaultStickyMaxEntries bounds a sticky table whose bound is not set.
const DefaultStickyMaxEntries = 100_000

// NewState makes a State with settings s and starts its probers and clock.
func NewState(s Settings) (*State, error) {
	s.setDefaults()
	tr, err := NewTracker(s.Tracker)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &State{tracker: tr, table: sticky.New(s.StickyMaxEntries, s.StickyTTL), since: time.Now(),
		cancel: cancel, done: make(chan struct{})}
	st.applyStickyStore(s)
	st.settings = s
	st.clock.Store(time.Now().UnixNano())
	tr.Start()
	go st.tick(ctx)
	return st, nil
}

// tick advances the coarse clock (reading it is cheaper than time.Now per
// request) and sweeps idle sticky entries.
func (st *State) tick(ctx context.Context) {
	defer close(st.done)
	tick := time.NewTicker(clockTick)
	defer tick.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			st.clock.Store(now.UnixNano())
			st.tracker.Reevaluate(now)
			if now.Sub(lastSweep) >= sweepInterval {
				st.table.Sweep(now.UnixNano())
				lastSweep = now
			}
		}
	}
}

// Close stops the probers and the clock and waits for them.
func (st *State) Close() {
	if sh := st.stickyStore.Swap(nil); sh != nil {
		sh.close()
	}
	st.cancel()
	st.tracker.Stop()
	<-st.done
}

// Tracker returns the state's tracker.
func (st *State) Tracker() *Tracker { return st.tracker }

// Table returns the sticky table (empty while sticky is off).
func (st *State) Table() *sticky.Table { return st.table }

// StickyStore returns the shared level in force, or nil (none, or sticky off).
// A Selector takes it when its config generation is provisioned.
func (st *State) StickyStore() *StickyStore { return st.stickyStore.Load() }

// StickyStoreStats returns the shared level's counters (kept across reloads).
func (st *State) StickyStoreStats() *StickyStoreStats { return &st.stickyStoreStats }

// Now is the coarse clock, in unix ns.
func (st *State) Now() int64 { return st.clock.Load() }

// Since is when the state was made: it stays the same across reloads that
// adopt it.
func (st *State) Since() time.Time { return st.since }

// Settings returns the settings in force.
func (st *State) Settings() Settings {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.settings
}

// Leases returns how many users (config generations) hold the state.
func (st *State) Leases() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.leases)
}

// ErrConflict is returned by Lease when one owner asks for the same state
// twice with different settings.
var ErrConflict = errors.New("pubsel: one state leased twice by the same owner with different settings")

// Lease is one config generation's use of a State: its settings and the
// targets it holds.
type Lease struct {
	st       *State
	owner    any
	settings Settings
	holder   *Holder
}

// Lease takes the state for owner (a config generation) with settings s,
// which are applied to the state at once (see Tracker.Apply and
// sticky.Table.SetLimits; sticky off empties the table). The newest lease's
// settings stay in force; when it is released first (a config that failed
// to load), the previous one's come back. Two leases of one owner must
// agree on the settings.
func (st *State) Lease(owner any, s Settings) (*Lease, error) {
	if err := s.Tracker.Validate(); err != nil {
		return nil, err
	}
	s.setDefaults()
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, l := range st.leases {
		if l.owner == owner && !l.settings.same(s) {
			return nil, ErrConflict
		}
	}
	l := &Lease{st: st, owner: owner, settings: s, holder: st.tracker.Hold()}
	st.leases = append(st.leases, l)
	st.apply(s)
	return l, nil
}

// apply puts s in force; st.mu is held.
func (st *State) apply(s Settings) {
	_ = st.tracker.Apply(s.Tracker) // validated by Lease
	if s.Sticky {
		st.table.SetLimits(s.StickyMaxEntries, s.StickyTTL)
	} else if st.settings.Sticky {
		st.table.Clear()
	}
	st.applyStickyStore(s)
	st.settings = s
}

// applyStickyStore makes the shared level s asks for, or keeps the current one
// if it is the same (a new TTL applies to it).
func (st *State) applyStickyStore(s Settings) {
	want := s.StickyStore
	if !s.Sticky {
		want = nil
	}
	cur := st.stickyStore.Load()
	if cur != nil && want != nil && sameStickyStore(&cur.cfg, want) {
		cur.setTTL(s.StickyTTL)
		return
	}
	var next *StickyStore
	if want != nil {
		next = newStickyStore(*want, &st.stickyStoreStats, s.StickyTTL)
	}
	if old := st.stickyStore.Swap(next); old != nil {
		old.close()
	}
}

// Holder returns the lease's claim on targets, for a Selector.
func (l *Lease) Holder() *Holder { return l.holder }

// Ensure holds addr for the lease and returns its target id.
func (l *Lease) Ensure(addr string) (uint32, error) { return l.holder.Ensure(addr) }

// Release ends the lease: targets no other lease holds stop being probed
// and their sticky pairs are forgotten; if it was the newest lease, the
// settings of the newest remaining one are put back in force.
func (l *Lease) Release() {
	st := l.st
	st.mu.Lock()
	defer st.mu.Unlock()
	i := -1
	for j, x := range st.leases {
		if x == l {
			i = j
		}
	}
	if i < 0 {
		return
	}
	st.leases = append(st.leases[:i], st.leases[i+1:]...)
	l.holder.Release(func(id uint32) { st.table.DeleteValue(id) })
	if i == len(st.leases) && i > 0 {
		st.apply(st.leases[i-1].settings)
	}
}
