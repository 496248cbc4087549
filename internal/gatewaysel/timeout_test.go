package gatewaysel

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sleepingProber answers each address after its RTT, really waiting, and
// never answers a silent one (a gateway whose SYNs are dropped): such a
// probe ends only with its context. It records how many probes of one
// address overlapped at most.
type sleepingProber struct {
	rtts   map[string]time.Duration // absent: silent
	mu     sync.Mutex
	active map[string]int
	peak   map[string]int
	silent atomic.Int64 // probes of silent addresses that ended
}

func newSleepingProber(rtts map[string]time.Duration) *sleepingProber {
	return &sleepingProber{rtts: rtts, active: map[string]int{}, peak: map[string]int{}}
}

func (p *sleepingProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	p.mu.Lock()
	p.active[addr]++
	p.peak[addr] = max(p.peak[addr], p.active[addr])
	rtt, ok := p.rtts[addr]
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.active[addr]--
		p.mu.Unlock()
	}()
	if !ok {
		<-ctx.Done()
		p.silent.Add(1)
		return 0, ctx.Err()
	}
	select {
	case <-time.After(rtt):
		return rtt, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (p *sleepingProber) peakOf(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak[addr]
}

// A silent gateway next to live ones: each of its probes ends at the probe
// timeout, so the run ends then, long before the run's deadline, and the
// query (whose answer deadline is longer still) gets the probed order, the
// silent gateway last.
func TestSilentGatewayEndsAtProbeTimeout(t *testing.T) {
	p := newSleepingProber(map[string]time.Duration{"a:1": 30 * ms, "b:1": 10 * ms, "d:1": 20 * ms}) // c:1 silent
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: time.Minute, AnswerDeadline: 5 * time.Second, ProbeTimeout: 200 * ms})
	sel := s.Select(context.Background(), "loc")
	if sel.Source != Probed || !slices.Equal(sel.Names(), []string{"gw2", "gw4", "gw1", "gw3"}) {
		t.Fatalf("%v %v, want the probed order with the silent gw3 last", sel.Source, sel.Names())
	}
	if sel.Reasons[2] != ReasonTimeout {
		t.Fatalf("silent gateway's reason %q, want timeout", sel.Reasons[2])
	}
	if n := p.silent.Load(); n != 3 {
		t.Fatalf("%d probes of the silent gateway ended, want its 3", n)
	}
}

// A gateway's probes overlap (they start ProbeSpacing apart), so a run
// costs about one RTT, not one per probe.
func TestGatewayProbesOverlap(t *testing.T) {
	p := newSleepingProber(map[string]time.Duration{"a:1": 300 * ms, "b:1": 300 * ms, "c:1": 300 * ms, "d:1": 300 * ms})
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: time.Minute, AnswerDeadline: time.Minute, ProbeTimeout: 10 * time.Second})
	if sel := s.Select(context.Background(), "loc"); sel.Source != Probed {
		t.Fatalf("source %v", sel.Source)
	}
	for _, addr := range []string{"a:1", "b:1", "c:1", "d:1"} {
		if n := p.peakOf(addr); n < 2 {
			t.Fatalf("%s: at most %d probe at a time, want its 3 probes overlapping", addr, n)
		}
	}
}

// A run still going at the answer deadline: the query gets the gateways
// answered so far, by the rule, the others after them; the run goes on in
// the background and its result answers the next queries. A location with
// a previous selection and nothing heard yet gets that selection.
func TestAnswerDeadlineGivesWhatAnswered(t *testing.T) {
	p := newSleepingProber(map[string]time.Duration{"a:1": 30 * ms, "b:1": 10 * ms, "d:1": 20 * ms}) // c:1 silent
	gws := exampleGateways()
	gws[1].Backups = []string{"gw3", "gw1"}
	s := newSel(t, Config{Gateways: gws, Prober: p, Deadline: time.Minute, AnswerDeadline: 150 * ms, ProbeTimeout: 600 * ms})
	sel := s.Select(context.Background(), "loc")
	if sel.Source != Partial || sel.Why != WhyDeadline || !slices.Equal(sel.Names(), []string{"gw2", "gw1", "gw4", "gw3"}) {
		t.Fatalf("at the answer deadline: %v %v %v, want partial gw2 gw1 gw4 gw3", sel.Source, sel.Why, sel.Names())
	}
	if sel.RTTs[2] != 0 {
		t.Fatalf("gw3 has an RTT %v while still silent", sel.RTTs[2])
	}
	waitSource(t, s, "loc", Cached)

	// A previous selection, then every gateway silent: nothing heard by the
	// answer deadline, so the previous selection answers.
	now := time.Now()
	s.now = func() time.Time { return now }
	s.Reconfigure(Config{Gateways: gws, Prober: p, Deadline: time.Minute, AnswerDeadline: 150 * ms, ProbeTimeout: 600 * ms, CacheTTL: time.Hour})
	now = now.Add(2 * time.Hour)
	p.mu.Lock()
	p.rtts = map[string]time.Duration{}
	p.mu.Unlock()
	sel = s.Select(context.Background(), "loc")
	if sel.Source != Previous || sel.Why != WhyDeadline || sel.Names()[0] != "gw2" {
		t.Fatalf("nothing heard yet: %v %v %v, want the previous selection", sel.Source, sel.Why, sel.Names())
	}
}

func waitSource(t *testing.T, s *Table, loc string, want Source) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if sel := s.Select(context.Background(), loc); sel.Source == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered from %v", loc, want)
		}
		time.Sleep(10 * ms)
	}
}

// The answer deadline counts from the run's start: a query arriving later
// (a resolver's retry, with a new ID, while the first try is given up) is
// answered at once with what the run has so far, not after another wait.
func TestAnswerDeadlineCountsFromRunStart(t *testing.T) {
	p := newSleepingProber(map[string]time.Duration{"b:1": ms}) // the others silent
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: time.Hour, AnswerDeadline: time.Minute, ProbeTimeout: 3 * time.Second})
	var mu sync.Mutex
	now := time.Now()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ctx, cancel := context.WithTimeout(context.Background(), 100*ms) // the first try is given up
	sel := s.Select(ctx, "loc")
	cancel()
	if sel.Source == Probed || sel.Source == Cached {
		t.Fatalf("first try: %v", sel.Source)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute) // past the answer deadline since the run started
	mu.Unlock()
	if sel := s.Select(context.Background(), "loc"); sel.Source != Partial || sel.Names()[0] != "gw2" {
		t.Fatalf("a retry past the answer deadline: %v %v, want at once the gateways answered so far", sel.Source, sel.Names())
	}
}
