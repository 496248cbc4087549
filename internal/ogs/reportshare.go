package ogs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Client reports shared by replicas. With a ReportStore
// every accepted report is written to the store as well as kept here, and
// every replica pulls the locations changed since its last look on a
// timer, so each holds the same votes and, by the one rule of reports.go,
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

// ReportStore keeps client reports for every replica. A vote is one
// reporter's latest measurement of one gateway; a location's votes live
// for the report window after its latest write, and the store bounds the
// reporters per location and the locations in all, as the local table
// does.
type ReportStore interface {
	// PutVotes stores reporter's votes for location, each only where it is
	// not older than the stored vote of that reporter for that gateway;
	// latest is the reporter's newest measurement. The location's keys then
	// live ttl; its reporters are bounded by the rule of Reports (at most
	// b.PerToken of one token, the oldest of that token going, and at most
	// b.Reporters, the oldest of the token holding most going; reporter
	// itself stays), beyond b.Locations the location changed least
	// recently goes, and a location unchanged for ttl leaves the index.
	PutVotes(ctx context.Context, location, reporter string, votes []StoredVote, latest time.Time, ttl time.Duration, b StoreBounds) error
	// Changed returns at most limit locations changed at or after since (in
	// the store's clock, ms), oldest change first, each with its change's
	// time.
	Changed(ctx context.Context, since int64, limit int) ([]ChangedLocation, error)
	// Votes returns location's votes as stored: field → value (see
	// EncodeVote); the caller validates them.
	Votes(ctx context.Context, location string) (map[string]string, error)
}

// StoreBounds are the bounds a ReportStore keeps (ReportConfig's).
type StoreBounds struct{ Reporters, PerToken, Locations int }

// StoredVote is one vote as written to a ReportStore.
type StoredVote struct {
	Gateway string
	Value   string // EncodeVote's
	At      time.Time
}

// ChangedLocation is a location a ReportStore saw change, at (store clock, ms).
type ChangedLocation struct {
	Location string
	At       int64
}

// Report sharing defaults: how often a replica pulls changed locations, how
// many per store call, how many calls per look, and how many reporters'
// votes wait at most to be written again after a store error.
const (
	DefaultReportSync = time.Second
	reportSyncBatch   = 1000
	reportSyncRounds  = 10
	maxReportBacklog  = 10_000
)

// VoteField is a vote's field in the store: "REPORTER GATEWAY" (neither
// holds a space: token ids and gateway names are single words).
func VoteField(reporter, gateway string) string { return reporter + " " + gateway }

// EncodeVote is a vote's value in the store: its RTT in milliseconds ("-"
// for a failure) and its time in Unix milliseconds.
func EncodeVote(rtt time.Duration, failed bool, at time.Time) string {
	ms := "-"
	if !failed {
		ms = strconv.FormatFloat(float64(rtt)/float64(time.Millisecond), 'f', -1, 64)
	}
	return ms + " " + strconv.FormatInt(at.UnixMilli(), 10)
}

// decodeVote validates a stored vote like network input.
func decodeVote(field, value string, now time.Time) (reporter, gateway string, v vote, err error) {
	reporter, gateway, ok := strings.Cut(field, " ")
	if !ok || reporter == "" || gateway == "" || strings.Contains(gateway, " ") {
		return "", "", v, fmt.Errorf("field %q: want REPORTER GATEWAY", field)
	}
	ms, atS, ok := strings.Cut(value, " ")
	if !ok {
		return "", "", v, fmt.Errorf("value %q: want MS TIME", value)
	}
	atMs, err := strconv.ParseInt(atS, 10, 64)
	if err != nil || atMs <= 0 {
		return "", "", v, fmt.Errorf("value %q: bad time", value)
	}
	v.at = time.UnixMilli(atMs)
	if v.at.After(now.Add(ReportClockSkew)) {
		return "", "", v, fmt.Errorf("value %q: time in the future", value)
	}
	if ms == "-" {
		v.rtt = math.MaxInt64
		return reporter, gateway, v, nil
	}
	f, err := strconv.ParseFloat(ms, 64)
	if err != nil || math.IsNaN(f) || f <= 0 || f >= float64(MaxReportRTT/time.Millisecond) {
		return "", "", v, fmt.Errorf("value %q: RTT out of range", value)
	}
	v.rtt = time.Duration(f * float64(time.Millisecond))
	return reporter, gateway, v, nil
}

// Merge takes location's votes as a ReportStore holds them: each valid vote
// for a configured gateway inside the window replaces this table's vote of
// that reporter for that gateway unless that one is newer; the local bounds
// apply as for Add. It returns how many values were malformed (ignored).
func (r *Reports) Merge(location string, stored map[string]string, now time.Time) (malformed int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.cfg.Enabled {
		return 0, nil
	}
	var firstErr error
	var l *reportLocation
	for f, val := range stored {
		reporter, gw, v, err := decodeVote(f, val, now)
		if err != nil {
			malformed++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if _, ok := r.idx[gw]; !ok || !now.Before(v.at.Add(r.cfg.Window)) {
			continue // another configuration's gateway, or out of the window
		}
		if v.at.After(now) {
			v.at = now
		}
		if l == nil {
			l = r.location(location)
		}
		st := r.reporter(l, reporter)
		if old, ok := st.votes[gw]; ok && !old.at.Before(v.at) {
			continue
		}
		st.votes[gw] = v
		if v.at.After(st.latest) {
			st.latest = v.at
		}
		if v.at.After(l.latest) {
			l.latest = v.at
		}
		l.agg = nil
	}
	return malformed, firstErr
}

// storedVotes is reporter's votes at location as a ReportStore takes them.
func (r *Reports) storedVotes(location, reporter string) (votes []StoredVote, latest time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.locs[location]
	if l == nil || l.reporters[reporter] == nil {
		return nil, time.Time{}
	}
	st := l.reporters[reporter]
	for gw, v := range st.votes {
		votes = append(votes, StoredVote{Gateway: gw, Value: EncodeVote(v.rtt, v.rtt == math.MaxInt64, v.at), At: v.at})
	}
	return votes, st.latest
}

// reportStoreUsable reports whether a ReportStore is configured and the
// store is not resting after an error (of any kind of key: one Redis).
func (s *Selector) reportStoreUsable(cfg *Config) bool {
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
func (s *Selector) AddReport(location, reporter string, rep Report, now time.Time) error {
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
func (s *Selector) putReporter(cfg *Config, k reportKey) error {
	votes, latest := s.reports.storedVotes(k.location, k.reporter)
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
	err := cfg.ReportStore.PutVotes(ctx, k.location, k.reporter, votes, latest, rc.Window, StoreBounds{rc.MaxReporters, rc.MaxTokenReporters, rc.MaxLocations})
	cancel()
	s.storeDone(cfg, k.location, "put_reports", KeysReports, err)
	if err != nil {
		s.queueReport(k)
		return asTrouble("put_reports", err)
	}
	return nil
}

func (s *Selector) queueReport(k reportKey) {
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
func (s *Selector) syncReports() {
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
func (s *Selector) SyncReportsNow() {
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
func (s *Selector) reconcileReports(cfg *Config) {
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
func (s *Selector) pullReports(cfg *Config) {
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
func (s *Selector) ReportBacklog() (waiting int, dropped uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reportBacklog), s.reportBacklogDropped
}
