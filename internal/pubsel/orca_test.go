package pubsel

import (
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

func TestLoadFactor(t *testing.T) {
	for _, c := range []struct{ u, want float64 }{
		{-1, 1}, {0, 1}, {0.3, 1 / 0.7}, {0.5, 2}, {0.95, 20}, {1, 20}, {7, 20},
	} {
		if got := LoadFactor(c.u); got < c.want*0.999 || got > c.want*1.001 {
			t.Errorf("LoadFactor(%v) = %v, want %v", c.u, got, c.want)
		}
	}
}

// A fresh report scales the cost by LoadFactor: of two publishers at the
// same latency, the one reporting 0.95 (factor 20) loses to one reporting
// 0.3 (1.43) while the latter has 12 requests in flight or fewer
// (1.43 × 13 < 20; with 13 they tie, with 14 it is 1.43 × 15 > 20). A
// publisher without a fresh report (blackout, expired) takes the factor
// of the other drawn.
// Garbage, oversized and absent headers change nothing and are counted.
func TestP2CWeighsReportedLoad(t *testing.T) {
	const sec = int64(time.Second)
	periods := orca.Periods{Blackout: 10 * time.Second, Expiration: time.Minute}
	tr := newTracker(t, Config{ORCA: true, ORCAPeriods: periods})
	p := pubs(2)
	measure(t, tr, p[0].addr, 5*ms)
	measure(t, tr, p[1].addr, 5*ms)
	report := func(addr, v string, now int64) orca.Reason {
		f := tr.Begin(addr)
		defer f.Done()
		return tr.ReportLoad(f, v, false, now)
	}
	s := &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, IntN: draws(0, 0)}
	pick := func(now int64) *up {
		t.Helper()
		u, _, ok := s.SelectUnpinned(p, now)
		if !ok {
			t.Fatal("no pick")
		}
		return u
	}
	t0 := 1000 * sec
	for _, v := range []struct {
		addr, h string
	}{{p[0].addr, "TEXT cpu_utilization=0.95"}, {p[1].addr, "JSON {\"cpu_utilization\": 0.3}"}} {
		if why := report(v.addr, v.h, t0); why != orca.ReasonOK {
			t.Fatalf("%s: %v", v.h, why)
		}
	}
	// Blackout: both cost their latency alone; the first drawn wins a tie.
	if u := pick(t0 + 5*sec); u != p[0] {
		t.Fatalf("in blackout: picked %s, want the first drawn on a tie", u.addr)
	}
	// Fresh: the busy one loses, even to the other with 12 in flight...
	now := t0 + 11*sec
	for _, a := range []string{p[0].addr, p[1].addr} { // the runs go on
		report(a, map[string]string{p[0].addr: "TEXT cpu_utilization=0.95", p[1].addr: "TEXT cpu_utilization=0.3"}[a], now)
	}
	fs := inFlight(tr, p[1].addr, 12)
	if u := pick(now); u != p[1] {
		t.Fatalf("0.95 idle vs 0.3 with 12 in flight: picked %s", u.addr)
	}
	if l := tr.LoadOf(0, now); l.Factor < 19.99 || l.Factor > 20.01 || l.ORCA.State != orca.StateFresh ||
		l.Cost < 99*ms || l.Cost > 101*ms {
		t.Fatalf("busy one's load %+v, want factor 20, fresh, cost 100 ms", l)
	}
	// ...but not with 14 (1.43 × 15 × 5 ms = 107 ms > 100 ms).
	fs = append(fs, inFlight(tr, p[1].addr, 2)...)
	if u := pick(now); u != p[0] {
		t.Fatalf("0.95 idle vs 0.3 with 14 in flight: picked %s", u.addr)
	}
	for _, f := range fs {
		f.Done()
	}
	// Garbage, oversized and absent headers leave the reports as they were.
	long := "TEXT cpu_utilization=0.1, named_metrics.x=" + string(make([]byte, orca.MaxHeaderLen))
	for h, want := range map[string]orca.Reason{
		"TEXT cpu_utilization=zero": orca.ReasonBadNumber, "XML <cpu/>": orca.ReasonUnknownFormat,
		long: orca.ReasonTooLong, "": orca.ReasonEmpty, "TEXT mem_utilization=0.1": orca.ReasonNoUtilization,
	} {
		if why := report(p[0].addr, h, now+sec); why != want {
			t.Errorf("header %.30q: reason %v, want %v", h, why, want)
		}
	}
	if u := pick(now + sec); u != p[1] {
		t.Fatalf("after garbage headers: picked %s, want the 0.3 one still", u.addr)
	}
	absent, by := tr.LoadReports()
	if absent != 1 || by[orca.ReasonOK] != 4 || by[orca.ReasonBadNumber] != 1 || by[orca.ReasonTooLong] != 1 ||
		by[orca.ReasonUnknownFormat] != 1 || by[orca.ReasonNoUtilization] != 1 {
		t.Fatalf("counted absent %d, by reason %v", absent, by)
	}
	// Expired (a minute without a report): the 0.95 counts for nothing.
	if u := pick(now + 61*sec); u != p[0] {
		t.Fatalf("expired: picked %s, want the first drawn on a tie", u.addr)
	}
	// One fresh (0.3 again, after a blackout), the other expired: the
	// expired one takes the fresh one's factor, so they tie and the first
	// drawn wins (with a factor of 1 it would be the cheaper, whichever
	// was drawn first).
	report(p[1].addr, "TEXT cpu_utilization=0.3", now+61*sec)
	report(p[1].addr, "TEXT cpu_utilization=0.3", now+72*sec)
	s.IntN = draws(1, 0) // compare p[1], then p[0]
	if u := pick(now + 72*sec); u != p[1] {
		t.Fatalf("fresh 0.3 vs expired: picked %s, want a tie (the first drawn)", u.addr)
	}
	// ORCA off: reports are neither taken nor counted, and costs ignore them.
	off := newTracker(t, Config{})
	measure(t, off, p[0].addr, 5*ms)
	f := off.Begin(p[0].addr)
	if why := off.ReportLoad(f, "TEXT cpu_utilization=0.95", false, now); why != orca.ReasonOK {
		t.Fatalf("orca off: %v", why)
	}
	f.Done()
	if absent, by := off.LoadReports(); absent != 0 || by != [orca.NumReasons]uint64{} {
		t.Fatalf("orca off counted %d, %v", absent, by)
	}
	if l := off.LoadOf(0, now); l.Factor != 1 || l.ORCA.State != orca.StateNone {
		t.Fatalf("orca off: load %+v", l)
	}
}
