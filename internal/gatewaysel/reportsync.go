package gatewaysel

import (
	"errors"
	"fmt"
	"time"

	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// Client reports shared by replicas. With a ReportStore
// every accepted report is written to the store as well as kept here, and
// every replica pulls the locations changed since its last look on a
// timer, so each holds the same votes and, by the one rule of rttreports,
// computes the same aggregate: every replica answers a location the same,
// whichever replica its reporters reached. The aggregate is not stored: it
// is a function of the votes and the configuration, and a stored copy would
// be a second truth that could disagree with them.
//
// The store is never on a query's path: queries answer from the local
// table. A store error is counted and reported like the result store's
// (StoreEvent, keys KeysReports) and changes nothing locally: the report
// stays accepted and answers here; what could not be written is written
// again once the store answers (reconcileReports).

// Report sharing defaults: how often a replica pulls changed locations, how
// many per store call, how many calls per look, and how many reporters'
// votes wait at most to be written again after a store error.
const (
	DefaultReportSync = time.Second
	reportSyncBatch   = 1000
	reportSyncRounds  = 10
	maxReportBacklog  = 10_000
)

// reportStoreUsable reports whether a ReportStore is configured and the
// store is not resting after an error (of any kind of key: one Redis).
func (s *Table) reportStoreUsable(cfg *Config) bool {
	if cfg.ReportStore == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.now().Before(s.storeDownUntil)
}

// reportKey is a reporter of a location, waiting to be written again.
type reportKey struct{ location, reporter string }

// AddReport records rep like Reports.Add and, with a ReportStore, writes
// the reporter's votes to it within the store timeout. A store error does
// not refuse the report: it answers here, is reported (StoreEvent, keys
// KeysReports) and is written again once the store answers; the error is
// returned as a *StoreTrouble for the caller's information.
func (s *Table) AddReport(location, reporter string, rep rttreports.Report, now time.Time) error {
	if err := s.reports.Add(location, reporter, rep, now); err != nil {
		return err
	}
	cfg := s.Config()
	if cfg.ReportStore == nil {
		return nil
	}
	return s.putReporter(&cfg, reportKey{location, reporter})
}

// putReporter writes k's current votes, or queues them when the store is
// resting or fails.
func (s *Table) putReporter(cfg *Config, k reportKey) error {
	votes, latest := s.reports.StoredVotes(k.location, k.reporter)
	if len(votes) == 0 {
		return nil // evicted meanwhile: nothing to write
	}
	if !s.reportStoreUsable(cfg) {
		s.queueReport(k)
		return &StoreTrouble{Op: "put_reports", Keys: KeysReports, Reason: "resting", Err: errors.New("the store rests after an error")}
	}
	ctx, cancel := s.storeCtx(cfg)
	rc := cfg.Reports
	rc.FillDefaults()
	err := cfg.ReportStore.PutVotes(ctx, k.location, k.reporter, votes, latest, rc.Window, rc.Bounds())
	cancel()
	s.storeDone(cfg, k.location, "put_reports", KeysReports, err)
	if err != nil {
		s.queueReport(k)
		return asTrouble("put_reports", err)
	}
	return nil
}

func (s *Table) queueReport(k reportKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reportBacklog == nil {
		s.reportBacklog = map[reportKey]bool{}
	}
	if _, ok := s.reportBacklog[k]; ok || len(s.reportBacklog) < maxReportBacklog {
		s.reportBacklog[k] = true
	} else {
		s.reportBacklogDropped++
	}
}

// syncReports writes what waits to be written, then pulls the locations
// other replicas changed since the last look, every DefaultReportSync,
// until Close. Without a ReportStore it only waits.
func (s *Table) syncReports() {
	defer s.wg.Done()
	tick := time.NewTicker(DefaultReportSync)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		s.SyncReportsNow()
	}
}

// SyncReportsNow runs one sync step at once (tests; the timer calls it).
func (s *Table) SyncReportsNow() {
	cfg := s.Config()
	if !cfg.Reports.Enabled || !s.reportStoreUsable(&cfg) {
		return
	}
	s.reconcileReports(&cfg)
	if !s.reportStoreUsable(&cfg) {
		return
	}
	s.pullReports(&cfg)
}

// reconcileReports writes the reporters whose write failed. Each stays in
// the backlog until its write succeeded, so store_backlog counts it while
// it is retried. Its mark is cleared before the write; a report arriving
// meanwhile whose own write fails sets it again (queueReport), and then the
// reporter stays queued: the write here may have read the older votes.
func (s *Table) reconcileReports(cfg *Config) {
	s.mu.Lock()
	keys := make([]reportKey, 0, len(s.reportBacklog))
	for k := range s.reportBacklog {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		if s.ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.reportBacklog[k] = false
		s.mu.Unlock()
		if s.putReporter(cfg, k) != nil {
			return // queued again by putReporter; the store rests now
		}
		s.mu.Lock()
		if queued, ok := s.reportBacklog[k]; ok && !queued {
			delete(s.reportBacklog, k)
		}
		s.mu.Unlock()
	}
}

// pullReports merges the locations changed since the cursor. The cursor is
// the store's clock, so replicas' clocks do not matter; a change at the
// cursor's own millisecond is read again (merging is idempotent).
func (s *Table) pullReports(cfg *Config) {
	for range reportSyncRounds {
		s.mu.Lock()
		since := s.reportCursor
		s.mu.Unlock()
		ctx, cancel := s.storeCtx(cfg)
		changed, err := cfg.ReportStore.Changed(ctx, since, reportSyncBatch)
		cancel()
		s.storeDone(cfg, "", "sync_reports", KeysReports, err)
		if err != nil {
			return
		}
		cursor := since
		for _, c := range changed {
			ctx, cancel := s.storeCtx(cfg)
			stored, err := cfg.ReportStore.Votes(ctx, c.Location)
			cancel()
			s.storeDone(cfg, c.Location, "sync_reports", KeysReports, err)
			if err != nil {
				return // the cursor stays: read again next time
			}
			if n, err := s.reports.Merge(c.Location, stored, s.now()); n > 0 {
				s.report(cfg, StoreEvent{Kind: StoreMalformed, Location: c.Location, Err: fmt.Errorf("%d report vote(s) ignored: %v", n, err)})
			}
			cursor = max(cursor, c.At)
		}
		s.mu.Lock()
		s.reportCursor = cursor
		s.mu.Unlock()
		if len(changed) < reportSyncBatch || cursor == since {
			return
		}
	}
}

// ReportBacklog returns how many reporters wait to be written to the
// store, and how many were dropped because too many waited.
func (s *Table) ReportBacklog() (waiting int, dropped uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reportBacklog), s.reportBacklogDropped
}
