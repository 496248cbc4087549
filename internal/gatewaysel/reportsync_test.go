package gatewaysel

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

	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// memReportStore is a ReportStore in memory, with the Redis script's
// newer-wins rule and a counter for the store's clock.
type memReportStore struct {
	mu    sync.Mutex
	clock int64
	votes map[string]map[string]string // location → field → value
	at    map[string]int64             // location → change
	fail  bool
}

func (m *memReportStore) PutVotes(_ context.Context, location, reporter string, votes []rttreports.StoredVote, _ time.Time, _ time.Duration, _ rttreports.Bounds) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("down")
	}
	if m.votes[location] == nil {
		m.votes[location] = map[string]string{}
	}
	for _, v := range votes {
		f := rttreports.VoteField(reporter, v.Gateway)
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

func (m *memReportStore) Changed(_ context.Context, since int64, limit int) ([]rttreports.ChangedLocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, errors.New("down")
	}
	var out []rttreports.ChangedLocation
	for l, at := range m.at {
		if at >= since {
			out = append(out, rttreports.ChangedLocation{Location: l, At: at})
		}
	}
	slices.SortFunc(out, func(a, b rttreports.ChangedLocation) int { return int(a.At - b.At) })
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
	cfg := Config{Gateways: exampleGateways(), Prober: exampleProber(), ReportStore: st, StoreRetry: time.Nanosecond, Reports: rttreports.Config{Enabled: true, Probe: "https"}}
	a, b := newSel(t, cfg), newSel(t, cfg)
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			s := []*Table{a, b}[i%2]
			loc := fmt.Sprintf("10.%d.0.0/24", i%4)
			p := rep(now, "gw1", time.Duration(10+i%4)*ms, "gw2", 50*ms, "gw3", time.Duration(30-i%4)*ms, "gw4", "fail")
			if err := s.AddReport(loc, fmt.Sprintf("r%d|10.%d.0.%d", i, i%4, i), p, now); err != nil {
				t.Error(err)
			}
		}()
		go func() { defer wg.Done(); []*Table{a, b}[i%2].SyncReportsNow() }()
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
	if votes, _ := b.reports.StoredVotes("10.9.0.0/24", "r|10.9.0.1"); len(votes) != 1 {
		t.Fatalf("b: %v, want the report made while the store failed", votes)
	}
}

// heldReportStore blocks PutVotes while hold is set, telling entered.
type heldReportStore struct {
	*memReportStore
	hold    chan struct{}
	entered chan struct{}
}

func (h *heldReportStore) PutVotes(ctx context.Context, location, reporter string, votes []rttreports.StoredVote, latest time.Time, ttl time.Duration, b rttreports.Bounds) error {
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
	cfg := Config{Gateways: exampleGateways(), Prober: exampleProber(), ReportStore: st, StoreRetry: time.Nanosecond, Reports: rttreports.Config{Enabled: true, Probe: "https"}}
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
