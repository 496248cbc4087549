package ogs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Votes pulled from a shared store are validated like network input and
// merged by the local rule: a newer vote replaces an older one (never the
// reverse), a vote for an unconfigured gateway or past the window is left
// out, a malformed one is counted and ignored; the merged votes order the
// location as the same reports added here would.
func TestMergeStoredVotes(t *testing.T) {
	now := t0.Add(time.Hour)
	at := now.Add(-time.Minute)
	local := newReports(ReportConfig{Probe: "https"})
	shared := newReports(ReportConfig{Probe: "https"})
	stored := map[string]string{}
	for _, who := range []string{"a|192.0.2.1", "a|192.0.2.2", "b|192.0.2.3"} {
		p := rep(at, "gw1", 300*ms, "gw2", 130*ms, "gw3", 500*ms, "gw4", "fail")
		mustAdd(t, local, "192.0.2.0/24", who, p, now)
		for _, m := range p.Measurements {
			stored[VoteField(who, m.Gateway)] = EncodeVote(m.RTT, m.Failed, at)
		}
	}
	stored[VoteField("c|192.0.2.4", "gw9")] = EncodeVote(ms, false, at)                    // not configured here
	stored[VoteField("c|192.0.2.4", "gw1")] = EncodeVote(ms, false, now.Add(-5*time.Hour)) // past the window
	for f, v := range map[string]string{
		"no-space":                      "1 1",
		VoteField("d|192.0.2.5", "gw1"): "0 1700000000000",                         // RTT 0
		VoteField("d|192.0.2.5", "gw2"): "nan 1700000000000",                       // not a number
		VoteField("d|192.0.2.5", "gw3"): EncodeVote(ms, false, now.Add(time.Hour)), // future
		VoteField("d|192.0.2.5", "gw4"): "3600000 1700000000000",                   // an hour
		VoteField("e|192.0.2.6", "gw1"): "5",                                       // no time
	} {
		stored[f] = v
	}
	n, err := shared.Merge("192.0.2.0/24", stored, now)
	if n != 6 || err == nil {
		t.Fatalf("%d malformed (%v), want 6", n, err)
	}
	want, _ := orderNames(t, local, "192.0.2.0/24", now)
	got, reporters := orderNames(t, shared, "192.0.2.0/24", now)
	if !slices.Equal(got, want) || reporters != 3 {
		t.Fatalf("merged order %v from %d reporters, want %v from 3", got, reporters, want)
	}
	// An older stored vote does not replace a newer local one.
	mustAdd(t, shared, "192.0.2.0/24", "a|192.0.2.1", rep(now, "gw1", 10*ms), now)
	shared.Merge("192.0.2.0/24", map[string]string{VoteField("a|192.0.2.1", "gw1"): EncodeVote(900*ms, false, at)}, now)
	if v, _ := shared.storedVotes("192.0.2.0/24", "a|192.0.2.1"); !slices.ContainsFunc(v, func(sv StoredVote) bool {
		return sv.Gateway == "gw1" && sv.Value == EncodeVote(10*ms, false, now)
	}) {
		t.Fatalf("a newer local vote was replaced: %v", v)
	}
}

// memReportStore is a ReportStore in memory, with the Redis script's
// newer-wins rule and a counter for the store's clock.
type memReportStore struct {
	mu    sync.Mutex
	clock int64
	votes map[string]map[string]string // location → field → value
	at    map[string]int64             // location → change
	fail  bool
}

func (m *memReportStore) PutVotes(_ context.Context, location, reporter string, votes []StoredVote, _ time.Time, _ time.Duration, _ StoreBounds) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("down")
	}
	if m.votes[location] == nil {
		m.votes[location] = map[string]string{}
	}
	for _, v := range votes {
		f := VoteField(reporter, v.Gateway)
		if old, ok := m.votes[location][f]; ok {
			_, oldAt, _ := strings.Cut(old, " ")
			if n, _ := strconv.ParseInt(oldAt, 10, 64); n > v.At.UnixMilli() {
				continue
			}
		}
		m.votes[location][f] = v.Value
	}
	m.clock++
	m.at[location] = m.clock
	return nil
}

func (m *memReportStore) Changed(_ context.Context, since int64, limit int) ([]ChangedLocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, errors.New("down")
	}
	var out []ChangedLocation
	for l, at := range m.at {
		if at >= since {
			out = append(out, ChangedLocation{l, at})
		}
	}
	slices.SortFunc(out, func(a, b ChangedLocation) int { return int(a.At - b.At) })
	return out[:min(len(out), limit)], nil
}

func (m *memReportStore) Votes(_ context.Context, location string) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, errors.New("down")
	}
	return maps.Clone(m.votes[location]), nil
}

// Two selectors sharing one ReportStore, reports arriving at both at once
// while both sync (run under -race): once both synced, every location
// answers the same on both, from all its reporters. Reports accepted while
// the store fails answer locally, wait in the backlog and reach the other
// selector once the store answers again.
func TestSharedReportsConverge(t *testing.T) {
	st := &memReportStore{votes: map[string]map[string]string{}, at: map[string]int64{}}
	cfg := Config{Gateways: exampleGateways(), Prober: exampleProber(), ReportStore: st, StoreRetry: time.Nanosecond, Reports: ReportConfig{Enabled: true, Probe: "https"}}
	a, b := newSel(t, cfg), newSel(t, cfg)
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			s := []*Selector{a, b}[i%2]
			loc := fmt.Sprintf("10.%d.0.0/24", i%4)
			p := rep(now, "gw1", time.Duration(10+i%4)*ms, "gw2", 50*ms, "gw3", time.Duration(30-i%4)*ms, "gw4", "fail")
			if err := s.AddReport(loc, fmt.Sprintf("r%d|10.%d.0.%d", i, i%4, i), p, now); err != nil {
				t.Error(err)
			}
		}()
		go func() { defer wg.Done(); []*Selector{a, b}[i%2].SyncReportsNow() }()
	}
	wg.Wait()
	a.SyncReportsNow()
	b.SyncReportsNow()
	for i := range 4 {
		loc := fmt.Sprintf("10.%d.0.0/24", i)
		ra, na, oka := a.reports.Order(loc, now)
		rb, nb, okb := b.reports.Order(loc, now)
		if !oka || !okb || na != 10 || nb != 10 || !slices.Equal(ra.Order, rb.Order) || !slices.Equal(ra.RTTs, rb.RTTs) {
			t.Fatalf("%s: a %v from %d, b %v from %d; want the same from 10 reporters", loc, ra, na, rb, nb)
		}
	}
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	if err := a.AddReport("10.9.0.0/24", "r|10.9.0.1", rep(now, "gw1", ms), now); err == nil {
		t.Fatal("a store error was not reported")
	}
	if w, _ := a.ReportBacklog(); w != 1 {
		t.Fatalf("backlog %d, want 1", w)
	}
	st.mu.Lock()
	st.fail = false
	st.mu.Unlock()
	time.Sleep(time.Millisecond) // StoreRetry
	a.SyncReportsNow()
	b.SyncReportsNow()
	if w, _ := a.ReportBacklog(); w != 0 {
		t.Fatalf("backlog %d after the store returned", w)
	}
	if votes, _ := b.reports.storedVotes("10.9.0.0/24", "r|10.9.0.1"); len(votes) != 1 {
		t.Fatalf("b: %v, want the report made while the store failed", votes)
	}
}

// heldReportStore blocks PutVotes while hold is set, telling entered.
type heldReportStore struct {
	*memReportStore
	hold    chan struct{}
	entered chan struct{}
}

func (h *heldReportStore) PutVotes(ctx context.Context, location, reporter string, votes []StoredVote, latest time.Time, ttl time.Duration, b StoreBounds) error {
	if h.hold != nil {
		h.entered <- struct{}{}
		<-h.hold
	}
	return h.memReportStore.PutVotes(ctx, location, reporter, votes, latest, ttl, b)
}

// While the reporters waiting for the store are written again, the backlog
// still counts every one not written yet (store_backlog in the admin view):
// it never reads 0 while nothing was written. A report arriving meanwhile
// whose own write fails keeps its reporter queued after the retry wrote the
// older votes.
func TestReportBacklogCountsDuringRetry(t *testing.T) {
	st := &heldReportStore{memReportStore: &memReportStore{votes: map[string]map[string]string{}, at: map[string]int64{}}}
	cfg := Config{Gateways: exampleGateways(), Prober: exampleProber(), ReportStore: st, StoreRetry: time.Nanosecond, Reports: ReportConfig{Enabled: true, Probe: "https"}}
	s := newSel(t, cfg)
	now := time.Now()
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	for i := range 3 {
		s.AddReport("10.9.0.0/24", fmt.Sprintf("r%d|10.9.0.%d", i, i), rep(now, "gw1", ms), now)
	}
	if w, _ := s.ReportBacklog(); w != 3 {
		t.Fatalf("backlog %d, want 3", w)
	}
	st.mu.Lock()
	st.fail = false
	st.mu.Unlock()
	time.Sleep(time.Millisecond) // StoreRetry
	st.hold, st.entered = make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { s.SyncReportsNow(); close(done) }()
	for written := range 3 {
		<-st.entered
		want := 3 - written
		if written > 0 {
			want++ // the first one, queued again
		}
		if w, _ := s.ReportBacklog(); w != want {
			t.Errorf("during the retry's write %d: backlog %d, want %d", written+1, w, want)
		}
		if written == 0 { // a newer report of each reporter failed to write meanwhile
			for i := range 3 {
				s.queueReport(reportKey{"10.9.0.0/24", fmt.Sprintf("r%d|10.9.0.%d", i, i)})
			}
		}
		st.hold <- struct{}{}
	}
	<-done
	if w, _ := s.ReportBacklog(); w != 1 {
		t.Fatalf("backlog %d after the retry, want 1 (the reporter re-queued while its older votes were written)", w)
	}
}
