package gatewaysel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// fakeProber answers per address with a fixed RTT (0: fails), or blocks
// until the context ends when block is set.
type fakeProber struct {
	rtts  map[string]time.Duration
	block atomic.Bool
	calls atomic.Int64
}

func (p *fakeProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	p.calls.Add(1)
	if p.block.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	if d := p.rtts[addr]; d > 0 {
		return d, nil
	}
	return 0, errors.New("refused")
}

// exampleGateways and exampleProber are the worked example: four gateways of
// RTT gw1 302, gw2 132, gw3 506 and gw4 877 ms, so gw2 is optimal.
func exampleGateways() []gatewayorder.Gateway {
	return []gatewayorder.Gateway{{Name: "gw1", Addr: "a:1"}, {Name: "gw2", Addr: "b:1"}, {Name: "gw3", Addr: "c:1"}, {Name: "gw4", Addr: "d:1"}}
}

func exampleProber() *fakeProber {
	return &fakeProber{rtts: map[string]time.Duration{"a:1": 302 * ms, "b:1": 132 * ms, "c:1": 506 * ms, "d:1": 877 * ms}}
}

func newSel(t *testing.T, cfg Config) *Table {
	t.Helper()
	s, err := NewTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSelectProbesOnceThenCaches(t *testing.T) {
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p})
	res, src := pick(s.Select(context.Background(), "loc"))
	if src != Probed || !slices.Equal(res.Names(), []string{"gw2", "gw1", "gw3", "gw4"}) {
		t.Fatalf("%v %v", src, res.Names())
	}
	if p.calls.Load() != 12 {
		t.Fatalf("%d probes, want 3 per gateway", p.calls.Load())
	}
	if res.RTTs[1] != 132*ms {
		t.Fatalf("rtts %v", res.RTTs)
	}
	if _, src := pick(s.Select(context.Background(), "loc")); src != Cached || p.calls.Load() != 12 {
		t.Fatalf("second query: %v, %d probes", src, p.calls.Load())
	}
	// Another location gets its own run.
	if _, src := pick(s.Select(context.Background(), "other")); src != Probed || p.calls.Load() != 24 {
		t.Fatalf("other location: %v, %d probes", src, p.calls.Load())
	}
}

func TestConcurrentQueriesShareOneRun(t *testing.T) {
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p})
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, _ := pick(s.Select(context.Background(), "loc")); s.cfg.Gateways[res.Order[0]].Name != "gw2" {
				t.Errorf("got %v", res.Order)
			}
		}()
	}
	wg.Wait()
	if p.calls.Load() != 12 {
		t.Fatalf("%d probes for 20 concurrent queries, want one run of 12", p.calls.Load())
	}
}

// Past the deadline: the previous selection, or the configured order.
func TestDeadlineFallsBack(t *testing.T) {
	p := exampleProber()
	now := time.Unix(1_000_000, 0)
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p, Deadline: 100 * ms, CacheTTL: time.Hour, Retry: time.Minute})
	s.now = func() time.Time { return now }
	p.block.Store(true)
	res, src := pick(s.Select(context.Background(), "new"))
	if src != Configured || !slices.Equal(res.Order, []int{0, 1, 2, 3}) {
		t.Fatalf("no previous: %v %v", src, res.Order)
	}
	// Within the retry interval nothing is probed again. The query's wait
	// and the run end at the same deadline: count once the run has ended
	// (on a busy host its last probes start after the answer).
	waitRunEnded(t, s, "new")
	calls := p.calls.Load()
	if _, src := pick(s.Select(context.Background(), "new")); src != Configured || p.calls.Load() != calls {
		t.Fatalf("retry interval ignored: %v, %d probes", src, p.calls.Load()-calls)
	}

	p.block.Store(false)
	s.Select(context.Background(), "home")
	now = now.Add(2 * time.Hour) // the entry expires
	p.block.Store(true)
	res, src = pick(s.Select(context.Background(), "home"))
	if src != Previous || s.cfg.Gateways[res.Order[0]].Name != "gw2" {
		t.Fatalf("expired entry, gateways silent: %v %v", src, res.Order)
	}
}

// waitRunEnded waits until loc has no probe run in flight.
func waitRunEnded(t *testing.T, s *Table, loc string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(ms) {
		s.mu.Lock()
		e := s.entries[loc]
		running := e != nil && e.flight != nil
		s.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the probe run did not end", loc)
		}
	}
}

func TestSaveLoadAndForget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ogs.json")
	p := exampleProber()
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: p})
	s.Select(context.Background(), "10.1.2.0/24")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	// A restart: a new selector loads the file and answers from it.
	s2 := newSel(t, Config{Gateways: exampleGateways(), Prober: p, CacheFile: path, OnError: func(err error) { t.Error(err) }})
	if n, err := s2.Load(path); err != nil || n != 1 {
		t.Fatalf("loaded %d: %v", n, err)
	}
	calls := p.calls.Load()
	res, src := pick(s2.Select(context.Background(), "10.1.2.0/24"))
	if src != Cached || p.calls.Load() != calls || s2.cfg.Gateways[res.Order[0]].Name != "gw2" {
		t.Fatalf("after restart: %v, %d new probes", src, p.calls.Load()-calls)
	}
	// Expired entries are not loaded.
	s3 := newSel(t, Config{Gateways: exampleGateways(), Prober: p, CacheTTL: time.Hour})
	s3.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if n, _ := s3.Load(path); n != 0 {
		t.Fatalf("loaded %d expired entries", n)
	}

	// The background loop: deleting the file forgets every location.
	s2.Start()
	defer s2.Close()
	os.Remove(path)
	deadline := time.Now().Add(5 * time.Second)
	for s2.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("deleting the cache file did not forget the locations")
		}
		time.Sleep(5 * ms)
	}
	if _, src := pick(s2.Select(context.Background(), "10.1.2.0/24")); src != Probed {
		t.Fatalf("after deletion: %v, want a new probe run", src)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new result was not saved")
		}
		time.Sleep(5 * ms)
	}
}

func TestLocationsBounded(t *testing.T) {
	s := newSel(t, Config{Gateways: exampleGateways(), Prober: exampleProber(), MaxLocations: 5})
	for i := range 50 {
		s.Select(context.Background(), string(rune('A'+i)))
	}
	if s.Len() > 5 {
		t.Fatalf("%d locations held, bound 5", s.Len())
	}
}

func TestValidateNamesProblem(t *testing.T) {
	for _, c := range []Config{
		{},
		{Gateways: []gatewayorder.Gateway{{Name: "a", Addr: "x:1"}, {Name: "a", Addr: "y:1"}}},
		{Gateways: []gatewayorder.Gateway{{Name: "a", Addr: "x:1"}, {Name: "b", Addr: "x:1"}}},
		{Gateways: []gatewayorder.Gateway{{Name: "a", Addr: "x:1", Backups: []string{"zz"}}}},
		{Gateways: []gatewayorder.Gateway{{Name: "a", Addr: "x:1"}}, Probes: -1},
	} {
		if _, err := NewTable(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// A gateway's Run.Errors entry is its last failed probe's error, in probe
// order: here the first probe is refused at once and the second, due an
// hour later, is ended by the run's deadline.
func TestRunErrorsKeepTheLastFailedProbe(t *testing.T) {
	runs := make(chan Run, 1)
	s := newSel(t, Config{Gateways: []gatewayorder.Gateway{{Name: "gw1", Addr: "a:1"}}, Prober: &fakeProber{}, Probes: 2,
		ProbeSpacing: time.Hour, Deadline: 50 * ms, Recheck: -1, OnRun: func(r Run) { runs <- r }})
	defer s.Close()
	s.Select(context.Background(), "loc")
	r := <-runs
	if !errors.Is(r.Errors[0], context.DeadlineExceeded) || r.Reasons[0][0] == "" || r.Reasons[0][0] == r.Reasons[0][1] {
		t.Fatalf("errors %v, reasons %v; want the deadline's, after the first probe's refusal", r.Errors, r.Reasons)
	}
}
