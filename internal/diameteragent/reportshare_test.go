package diameteragent

import (
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/olrshare"
)

// reportReplicas are two DOIC agents sharing one report store whose clock
// is A's (the test advances B's with it).
func reportReplicas(t *testing.T) (a, b *harness, st *olrshare.MemStore) {
	cfg := doicConfig()
	a = newHarness(t, cfg)
	st = olrshare.NewMemStore(a.clock.Now)
	cfg.ReportStore = &olrshare.Config{Store: st, Name: "mem", Interval: 5 * time.Millisecond,
		DownFailures: 2, DownAfter: time.Millisecond}
	if err := a.agent.Update(cfg); err != nil {
		t.Fatal(err)
	}
	b = newHarness(t, cfg)
	a.start()
	b.start()
	return a, b, st
}

func reportOf(h *harness, name string) *doic.ReportView {
	for _, r := range h.agent.View().DOIC.Reports {
		if r.Name == name {
			return &r
		}
	}
	return nil
}

func storeOfReports(h *harness) olrshare.View { return *h.agent.View().DOIC.Store }

// A server's OC-OLR received by one replica throttles at the other: its
// new sessions are diverted there as at the first. The higher sequence
// number wins whichever replica received it, a lower one changes nothing,
// both expire at the report's validity; with the store down each replica
// goes on with its own reports, and what one took meanwhile reaches the
// other when the store is back.
func TestDOICReportsSharedByReplicas(t *testing.T) {
	a, b, st := reportReplicas(t)
	ca, cb := a.connect("pgw1.example"), b.connect("pgw1.example")
	olrA := doic.EncodeOLR(doic.HostReport, 5, 50, 10*time.Second, "")
	replyWith(t, a.srv["pcrf1.example"], "pcrf.example", func() [][]byte { return [][]byte{olrA} })
	sendNew(t, a, ca, 0, 2) // one answer from A's pcrf1 brings the report
	eventually(t, "B holding A's report", func() bool { r := reportOf(b, "pcrf1.example"); return r != nil && r.Sequence == 5 })
	if _, got := sendNew(t, b, cb, 100, 400); got["pcrf1.example"] != 100 || got["pcrf2.example"] != 300 {
		t.Fatalf("at B under A's 50 %% report: pcrf1 %d pcrf2 %d, want 100 and 300", got["pcrf1.example"], got["pcrf2.example"])
	}

	// B's pcrf1 repeats an older report (ignored), then a newer one: A takes it.
	olrB := doic.EncodeOLR(doic.HostReport, 4, 100, 10*time.Second, "")
	replyWith(t, b.srv["pcrf1.example"], "pcrf.example", func() [][]byte { return [][]byte{olrB} })
	sendNew(t, b, cb, 1000, 4)
	olrB = doic.EncodeOLR(doic.HostReport, 7, 80, 10*time.Second, "")
	sendNew(t, b, cb, 2000, 4)
	eventually(t, "A holding B's newer report", func() bool { r := reportOf(a, "pcrf1.example"); return r != nil && r.Sequence == 7 })
	if r := reportOf(a, "pcrf1.example"); r.Reduction != 80 {
		t.Fatalf("A's report after B's newer one: %+v", r)
	}
	time.Sleep(20 * time.Millisecond) // reads on both sides: nothing older comes back
	for _, h := range []*harness{a, b} {
		if r := reportOf(h, "pcrf1.example"); r == nil || r.Sequence != 7 || r.Reduction != 80 {
			t.Fatalf("report after both wrote: %+v", r)
		}
	}

	// Expiry by the validity the store gives.
	olrA, olrB = nil, nil
	a.clock.Advance(10 * time.Second)
	b.clock.Advance(10 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if _, got := sendNew(t, b, cb, 3000, 100); got["pcrf1.example"] != 50 {
		t.Fatalf("at B after expiry pcrf1 got %d of 100, want 50", got["pcrf1.example"])
	}
	if r := reportOf(a, "pcrf1.example"); r != nil {
		t.Fatalf("A's report after expiry: %+v", r)
	}

	// Store down: A's new report stays local, queued, and is reconciled.
	st.SetDown(true)
	eventually(t, "A's report store marked down", func() bool { return !storeOfReports(a).Healthy })
	olrA = doic.EncodeOLR(doic.HostReport, 1, 30, 20*time.Second, "")
	replyWith(t, a.srv["pcrf2.example"], "pcrf.example", func() [][]byte { return [][]byte{olrA} })
	sendNew(t, a, ca, 4000, 2)
	if reportOf(a, "pcrf2.example") == nil {
		t.Fatal("with the store down, A did not apply its own report")
	}
	v := storeOfReports(a)
	if v.Queued != 1 || v.Downs != 1 || v.DownSince.IsZero() || v.LastReason != "refused" {
		t.Fatalf("A's report store while down: %+v", v)
	}
	time.Sleep(20 * time.Millisecond)
	if reportOf(b, "pcrf2.example") != nil {
		t.Fatal("B holds a report written while the store was down")
	}
	st.SetDown(false)
	eventually(t, "B holding A's report made during the outage", func() bool { return reportOf(b, "pcrf2.example") != nil })
	if v := storeOfReports(a); !v.Healthy || v.Queued != 0 || v.Counts.Reconciled != 1 || v.Downs != 1 {
		t.Fatalf("A's report store after the outage: %+v", v)
	}
}
