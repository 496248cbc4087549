package orca

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/edgesteer/edgesteer/internal/loadsource"
)

// Source is what peer_rate_limit's sample loop reads.
var _ loadsource.Source = (*Source)(nil)

const sec = int64(time.Second)

func report(t *testing.T, s string) *Report {
	t.Helper()
	r := new(Report)
	if why := Parse(s, r); why != ReasonOK {
		t.Fatalf("%q: %v", s, why)
	}
	return r
}

// TestUpstreamBlackoutAndExpiration walks A58's rule on one upstream with
// a 10 s blackout and a 60 s expiration.
func TestUpstreamBlackoutAndExpiration(t *testing.T) {
	p := Periods{Blackout: 10 * time.Second, Expiration: 60 * time.Second}
	var u Upstream
	at := func(now int64, wantU float64, wantAge time.Duration, wantSt State) {
		t.Helper()
		util, age, st := u.Utilization(now, p)
		if st != wantSt || age != wantAge || (st != StateNone && util != wantU) {
			t.Fatalf("at %ds: %v %v %v, want %v %v %v", now/sec, util, age, st, wantU, wantAge, wantSt)
		}
	}
	at(100*sec, 0, 0, StateNone)
	u.Observe(report(t, "TEXT cpu_utilization=0.5"), 100*sec, p)
	at(100*sec, 0.5, 0, StateBlackout)
	at(109*sec, 0.5, 9*time.Second, StateBlackout)
	at(110*sec, 0.5, 10*time.Second, StateFresh) // reporting for 10 s since its first report
	u.Observe(report(t, "TEXT cpu_utilization=0.9,application_utilization=0.7"), 150*sec, p)
	at(150*sec, 0.7, 0, StateFresh) // application_utilization first
	at(209*sec, 0.7, 59*time.Second, StateFresh)
	at(210*sec, 0.7, 60*time.Second, StateExpired)
	// A report after a silence of the expiration period starts a new blackout.
	u.Observe(report(t, "TEXT cpu_utilization=0.2"), 211*sec, p)
	at(211*sec, 0.2, 0, StateBlackout)
	at(221*sec, 0.2, 10*time.Second, StateFresh)
	// Reports closer together than the expiration keep the run going.
	u.Observe(report(t, "TEXT cpu_utilization=0.3"), 270*sec, p)
	at(270*sec, 0.3, 0, StateFresh)
	// A report without a utilization changes nothing.
	if why := u.Observe(report(t, "TEXT mem_utilization=0.9,rps_fractional=5"), 280*sec, p); why != ReasonNoUtilization {
		t.Fatalf("observe without utilization: %v", why)
	}
	at(280*sec, 0.3, 10*time.Second, StateFresh)
	s := u.Snapshot(280*sec, p)
	if s.CPUUtilization != 0.3 || s.Utilization != 0.3 || s.ReportingFor != 69*time.Second || s.State != StateFresh {
		t.Fatalf("snapshot %+v", s)
	}
	u.Reset()
	at(280*sec, 0, 0, StateNone)
	if s := u.Snapshot(280*sec, p); s != (Snapshot{}) {
		t.Fatalf("snapshot after reset %+v", s)
	}
}

func TestUpstreamNoBlackout(t *testing.T) {
	p := Periods{Expiration: time.Minute}
	var u Upstream
	u.Observe(report(t, "JSON {\"cpu_utilization\":0}"), 5*sec, p)
	if util, _, st := u.Utilization(5*sec, p); st != StateFresh || util != 0 {
		t.Fatalf("explicit 0 without blackout: %v %v, want fresh 0", util, st)
	}
}

func TestPeriodsCheck(t *testing.T) {
	if err := DefaultPeriods.Check(); err != nil {
		t.Fatal(err)
	}
	if DefaultPeriods.Blackout != 10*time.Second || DefaultPeriods.Expiration != 3*time.Minute {
		t.Fatalf("defaults %+v, want A58's 10s and 3m", DefaultPeriods)
	}
	for _, p := range []Periods{{Blackout: -1, Expiration: time.Second}, {Expiration: 0}, {Expiration: -time.Second}} {
		if p.Check() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

// TestUpstreamConcurrent: reporters and readers at once (run with -race);
// a reader only ever sees a utilization some reporter wrote.
func TestUpstreamConcurrent(t *testing.T) {
	p := Periods{Expiration: time.Hour}
	var u Upstream
	reports := []*Report{report(t, "TEXT cpu_utilization=0.25"), report(t, "TEXT application_utilization=0.75")}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				u.Observe(reports[(g+i)%2], int64(1+i), p)
			}
		}()
	}
	bad := make(chan float64, 1)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if util, _, st := u.Utilization(3000, p); st != StateNone && util != 0.25 && util != 0.75 {
					select {
					case bad <- util:
					default:
					}
				}
			}
		}()
	}
	wg.Wait()
	close(bad)
	if v, ok := <-bad; ok {
		t.Fatalf("read utilization %v, never written", v)
	}
}

func TestTrackerBoundAndEviction(t *testing.T) {
	p := Periods{Expiration: 60 * time.Second}
	tr, err := NewTracker(p, 2)
	if err != nil {
		t.Fatal(err)
	}
	r := report(t, "TEXT cpu_utilization=0.4")
	if why := tr.Observe("a:1", r, 10*sec); why != ReasonOK {
		t.Fatal(why)
	}
	if why := tr.Observe("b:1", r, 40*sec); why != ReasonOK {
		t.Fatal(why)
	}
	// Full, and a reported 40 s ago is not stale yet.
	if why := tr.Observe("c:1", r, 50*sec); why != ReasonTableFull || tr.Len() != 2 || tr.Get("c:1") != nil {
		t.Fatalf("third upstream in a table of 2: %v, len %d", why, tr.Len())
	}
	// A report without utilization takes no room and says why.
	if why := tr.Observe("d:1", report(t, "TEXT eps=1"), 50*sec); why != ReasonNoUtilization || tr.Get("d:1") != nil {
		t.Fatalf("report without utilization: %v", why)
	}
	// Known upstreams still report when the table is full.
	if why := tr.Observe("b:1", r, 75*sec); why != ReasonOK {
		t.Fatal(why)
	}
	// At 70 s a's report is 60 s old: stale, so c takes its place.
	if why := tr.Observe("c:1", r, 70*sec); why != ReasonOK || tr.Get("a:1") != nil || tr.Get("c:1") == nil || tr.Get("b:1") == nil {
		t.Fatalf("stale entry not evicted: %v, len %d", why, tr.Len())
	}
	n := 0
	tr.Each(func(string, *Upstream) { n++ })
	if n != 2 {
		t.Fatalf("Each visited %d, want 2", n)
	}
	if _, err := NewTracker(p, 0); err == nil {
		t.Error("max 0 accepted")
	}
	if _, err := NewTracker(Periods{}, 1); err == nil {
		t.Error("zero expiration accepted")
	}
}

// TestTrackerKeyCopied: a key sliced from a reused buffer is kept as it
// was when added.
func TestTrackerKeyCopied(t *testing.T) {
	tr, _ := NewTracker(DefaultPeriods, 4)
	buf := []byte("10.0.0.1:80")
	tr.Observe(unsafe.String(&buf[0], len(buf)), report(t, "TEXT cpu_utilization=0.1"), sec)
	copy(buf, "99.9.9.9:99")
	if tr.Get("10.0.0.1:80") == nil {
		t.Fatal("key not found")
	}
}

func TestTrackerLoadAndSource(t *testing.T) {
	p := Periods{Blackout: 10 * time.Second, Expiration: 60 * time.Second}
	tr, _ := NewTracker(p, 8)
	tr.Observe("a", report(t, "TEXT cpu_utilization=0.3"), 100*sec)
	tr.Observe("b", report(t, "TEXT cpu_utilization=0.9"), 100*sec)
	tr.Observe("c", report(t, "TEXT cpu_utilization=0.6"), 100*sec)
	tr.Observe("d", report(t, "TEXT cpu_utilization=1.0"), 140*sec) // in blackout at 145 s
	now := 145 * sec
	if load, n := tr.Load(now, AggregateMax); n != 3 || load != 0.9 {
		t.Fatalf("max: %v of %d, want 0.9 of 3", load, n)
	}
	if load, n := tr.Load(now, AggregateMean); n != 3 || math.Abs(load-0.6) > 1e-12 {
		t.Fatalf("mean: %v of %d, want 0.6 of 3", load, n)
	}
	src := &Source{Tracker: tr, Aggregate: AggregateMax, Clock: func() int64 { return now }}
	if v, err := src.Read(context.Background()); err != nil || v != 90 {
		t.Fatalf("read %v %v, want 90", v, err)
	}
	now = 150 * sec // d is out of blackout and reports above its soft limit
	tr.Observe("d", report(t, "TEXT cpu_utilization=1.7"), now)
	if v, err := src.Read(context.Background()); err != nil || v != 100 {
		t.Fatalf("read %v %v, want capped 100", v, err)
	}
	now = 300 * sec // every report expired
	if _, err := src.Read(context.Background()); !errors.Is(err, ErrNoFreshReport) {
		t.Fatalf("read with nothing fresh: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := src.Read(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("read with a done context: %v", err)
	}
	// A reload's periods apply to the reports kept.
	tr.SetPeriods(Periods{Expiration: time.Hour})
	if _, n := tr.Load(now, AggregateMax); n != 4 {
		t.Fatalf("after SetPeriods: %d fresh, want 4", n)
	}
	for _, c := range []struct {
		s    string
		want Aggregate
		ok   bool
	}{{"max", AggregateMax, true}, {"", AggregateMax, true}, {"mean", AggregateMean, true}, {"avg", 0, false}} {
		a, err := ParseAggregate(c.s)
		if (err == nil) != c.ok || (c.ok && a != c.want) {
			t.Errorf("ParseAggregate(%q) = %v %v", c.s, a, err)
		}
	}
}

// TestTrackerObserveCPU: the CPU-only caller weighs by cpu_utilization even
// when application_utilization is there, and takes no report without it.
func TestTrackerObserveCPU(t *testing.T) {
	tr, _ := NewTracker(Periods{Expiration: time.Minute}, 4)
	if why := tr.ObserveCPU("a", report(t, "TEXT cpu_utilization=0.8,application_utilization=0.2"), sec); why != ReasonOK {
		t.Fatalf("observe: %v", why)
	}
	if why := tr.ObserveCPU("b", report(t, "TEXT application_utilization=0.9"), sec); why != ReasonNoUtilization {
		t.Fatalf("observe without cpu_utilization: %v, want no_utilization", why)
	}
	if tr.Len() != 1 {
		t.Fatalf("%d upstreams kept, want 1: a report refused takes no room", tr.Len())
	}
	if load, n := tr.Load(2*sec, AggregateMax); n != 1 || load != 0.8 {
		t.Fatalf("load %v of %d, want cpu 0.8 of 1", load, n)
	}
}

// Fresh agrees with Utilization's state at every point around the periods.
func TestFreshAgreesWithUtilization(t *testing.T) {
	p := Periods{Blackout: 10, Expiration: 100}
	var u Upstream
	r := Report{CPUUtilization: 0.5, Has: FieldCPU}
	if u.Fresh(1, p) {
		t.Fatal("fresh before any report")
	}
	u.Observe(&r, 1000, p)
	u.Observe(&r, 1050, p)
	for now := int64(900); now < 1300; now++ {
		_, _, st := u.Utilization(now, p)
		if got := u.Fresh(now, p); got != (st == StateFresh) {
			t.Fatalf("at %d: Fresh %v, state %v", now, got, st)
		}
	}
}
