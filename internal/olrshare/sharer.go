package olrshare

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/storefault"
)

// Sharer is the shared level of one agent's reports in force.
type Sharer struct {
	cfg    atomic.Pointer[Config]
	table  *doic.Table
	now    func() time.Time
	log    *slog.Logger
	health *storefault.Health

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	queue map[key]queued

	stats stats
}

type key struct {
	typ  doic.ReportType
	name string
}

// queued is a report waiting to be written: its expiry by the agent's
// clock (its validity left is taken when it is sent); deferred says it
// waited through store trouble.
type queued struct {
	seq       uint64
	reduction uint32
	expires   time.Time
	deferred  bool
}

// New starts the shared level of table's reports; now is the agent's
// clock, log may be nil.
func New(cfg Config, table *doic.Table, now func() time.Time, log *slog.Logger) *Sharer {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Sharer{table: table, now: now, log: log, health: storefault.NewHealth(), wake: make(chan struct{}, 1),
		done: make(chan struct{}), queue: map[key]queued{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.Configure(cfg)
	go s.run()
	return s
}

// Configure applies a reload's configuration; the queue, the health and
// the counts stay.
func (s *Sharer) Configure(cfg Config) {
	cfg.setDefaults()
	s.cfg.Store(&cfg)
}

// Close stops the goroutine; reports still queued are not written.
func (s *Sharer) Close() {
	s.cancel()
	<-s.done
}

// Publish queues a report the table took (reduction or validity 0: one it
// ended), replacing one queued for the same key, and wakes the writer.
func (s *Sharer) Publish(typ doic.ReportType, name string, seq uint64, reduction uint32, validity time.Duration) {
	if validity == 0 {
		reduction = 0
	}
	k := key{typ, name}
	healthy := s.health.Healthy()
	s.mu.Lock()
	q, there := s.queue[k]
	if !there && len(s.queue) >= s.cfg.Load().Backlog {
		s.mu.Unlock()
		s.stats.dropped.Add(1)
		return
	}
	if !there || seq > q.seq {
		s.queue[k] = queued{seq: seq, reduction: reduction, expires: s.now().Add(validity), deferred: q.deferred || !healthy}
	}
	s.mu.Unlock()
	if healthy {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// run writes the queue when woken, and every Interval reads the store
// (or, while it is down, pings it).
func (s *Sharer) run() {
	defer close(s.done)
	interval := s.cfg.Load().Interval
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		tick := false
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
			tick = true
		}
		if i := s.cfg.Load().Interval; i != interval {
			interval = i
			t.Reset(i)
		}
		if !s.health.Healthy() && (!tick || !s.recheck()) {
			continue
		}
		s.flush()
		if tick {
			s.read()
		}
	}
}

// recheck pings a down store; true once it answers (logged once).
func (s *Sharer) recheck() bool {
	cfg := s.cfg.Load()
	ctx, cancel := context.WithTimeout(s.ctx, cfg.Timeout)
	err := cfg.Store.Ping(ctx)
	cancel()
	if err != nil {
		s.fail(err)
		return false
	}
	if down, ok := s.health.Back(time.Now()); ok {
		s.mu.Lock()
		n := len(s.queue)
		s.mu.Unlock()
		s.log.Info("doic report store back: writing the reports taken meanwhile, reading the others'",
			"store", cfg.Name, "down_for", down.Round(time.Millisecond).String(), "queued", n)
	}
	return true
}

// flush writes the queue, a batch at a time, until it is empty or a call
// fails (what failed waits for the next round).
func (s *Sharer) flush() {
	for s.health.Healthy() && s.ctx.Err() == nil {
		keys, items := s.take()
		if len(items) == 0 {
			return
		}
		now := s.now()
		entries := make([]Entry, 0, len(items))
		sent := make([]int, 0, len(items))
		for i, q := range items {
			left := q.expires.Sub(now)
			if q.reduction > 0 && left <= 0 {
				s.stats.expired.Add(1) // ran out while queued
				continue
			}
			entries = append(entries, Entry{Type: keys[i].typ, Name: keys[i].name, Seq: q.seq, Reduction: q.reduction,
				Remaining: max(left, 0)})
			sent = append(sent, i)
		}
		cfg := s.cfg.Load()
		ctx, cancel := context.WithTimeout(s.ctx, cfg.Timeout)
		errs := cfg.Store.Offer(ctx, entries)
		cancel()
		failed := false
		for j, i := range sent {
			var err error = &Trouble{Reason: "other", Err: context.Canceled}
			if j < len(errs) {
				err = errs[j]
			}
			if err != nil {
				failed = true
				s.requeue(keys[i], items[i])
				s.fail(err)
				continue
			}
			s.health.Answered()
			s.stats.written.Add(1)
			if items[i].deferred {
				s.stats.reconciled.Add(1)
			}
		}
		if failed {
			return
		}
	}
}

// take removes up to a batch of reports from the queue.
func (s *Sharer) take() ([]key, []queued) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(s.queue), batch)
	keys, items := make([]key, 0, n), make([]queued, 0, n)
	for k, q := range s.queue {
		if len(items) == n {
			break
		}
		keys, items = append(keys, k), append(items, q)
		delete(s.queue, k)
	}
	return keys, items
}

// requeue puts back a report the store did not take, unless a newer one
// for its key was queued meanwhile.
func (s *Sharer) requeue(k key, q queued) {
	q.deferred = true
	s.mu.Lock()
	if cur, newer := s.queue[k]; !newer || cur.seq < q.seq {
		s.queue[k] = q
	}
	s.mu.Unlock()
}

// read merges the store's reports into the table, by the sequence rule.
func (s *Sharer) read() {
	cfg := s.cfg.Load()
	ctx, cancel := context.WithTimeout(s.ctx, cfg.Timeout)
	entries, malformed, err := cfg.Store.Read(ctx)
	cancel()
	if err != nil {
		s.fail(err)
		return
	}
	s.health.Answered()
	s.stats.reads.Add(1)
	s.stats.malformed.Add(int64(malformed))
	now := s.now()
	for _, e := range entries {
		if !Valid(e) {
			s.stats.malformed.Add(1)
			continue
		}
		if s.table.Merge(e.Type, e.Name, e.Seq, e.Reduction, e.Remaining, now) {
			s.stats.merged.Add(1)
		}
	}
}

// fail counts a failed call; the transition to down is logged once.
func (s *Sharer) fail(err error) {
	s.stats.errors.Add(1)
	cfg := s.cfg.Load()
	reason, down := s.health.Fail(err, time.Now(), cfg.DownFailures, cfg.DownAfter)
	if down {
		s.mu.Lock()
		n := len(s.queue)
		s.mu.Unlock()
		s.log.Warn("doic report store down: each replica applies the reports it received; those taken are queued and written when it answers",
			"store", cfg.Name, "reason", reason, "error", err.Error(), "queued", n)
	}
}

type stats struct {
	written, reconciled, reads, merged  atomic.Int64
	malformed, errors, dropped, expired atomic.Int64
}

// View is the shared level's state for the admin view.
type View struct {
	Store string `json:"store"`
	storefault.HealthView
	Queued  int    `json:"queued"`  // reports waiting to be written
	Backlog int    `json:"backlog"` // their bound
	Counts  Counts `json:"counts"`
}

// Counts are the shared level's counters since the agent was made.
type Counts struct {
	Written    int64 `json:"written"`    // reports written (or found older than the store's)
	Reconciled int64 `json:"reconciled"` // of which written after waiting through store trouble
	Reads      int64 `json:"reads"`      // reads of the store's reports
	Merged     int64 `json:"merged"`     // reports of other replicas taken into the table (new, replacing or ending one)
	Malformed  int64 `json:"malformed"`  // values read that are no report
	Errors     int64 `json:"errors"`     // calls that failed or timed out
	Dropped    int64 `json:"dropped"`    // not queued: the backlog was full
	Expired    int64 `json:"expired"`    // not written: expired while queued
}

// View returns the shared level's state now.
func (s *Sharer) View() View {
	cfg := s.cfg.Load()
	s.mu.Lock()
	n := len(s.queue)
	s.mu.Unlock()
	c := &s.stats
	return View{Store: cfg.Name, HealthView: s.health.View(), Queued: n, Backlog: cfg.Backlog,
		Counts: Counts{Written: c.written.Load(), Reconciled: c.reconciled.Load(), Reads: c.reads.Load(),
			Merged: c.merged.Load(), Malformed: c.malformed.Load(), Errors: c.errors.Load(), Dropped: c.dropped.Load(),
			Expired: c.expired.Load()}}
}
