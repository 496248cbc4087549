package gatewaysel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStore has Redis' semantics for what the Table uses: values and
// locks expire after their TTL, GetOrLock and Publish are atomic (as the
// plugin's scripts are), a lock is released only by its token. down makes
// every call fail; hang makes every call block until its context ends;
// refuse fails the calls that touch the keys it names, as an ACL does.
// afterEmptyRead, if set, runs once after the first GetOrLock that found no
// value: another replica acting between this step and the next.
type fakeStore struct {
	mu     sync.Mutex
	values map[string]stored
	locks  map[string]stored
	down   atomic.Bool
	hang   atomic.Bool
	wrong  atomic.Bool   // the value key is of another type
	refuse atomic.Uint32 // StoreKeys refused
	calls  atomic.Int64
	sets   atomic.Int64
	// afterEmptyRead runs once, after the first GetOrLock that found no value.
	afterEmptyRead func(loc string)
	once           sync.Once
}

type stored struct {
	v   string
	exp time.Time
}

func newFakeStore() *fakeStore {
	return &fakeStore{values: map[string]stored{}, locks: map[string]stored{}}
}

var errDown = errors.New("connection refused")

func (f *fakeStore) enter(ctx context.Context, op string, keys StoreKeys) error {
	f.calls.Add(1)
	if f.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.down.Load() {
		return errDown
	}
	if r := StoreKeys(f.refuse.Load()) & keys; r != 0 {
		return &StoreTrouble{Op: op, Keys: r, Reason: "noperm", Err: errors.New("NOPERM no permissions to access a key")}
	}
	return nil
}

// current is loc's live value and lock holder; called with f.mu held.
func (f *fakeStore) current(loc string) (value, lock string) {
	if v, ok := f.values[loc]; ok && time.Now().Before(v.exp) {
		value = v.v
	}
	if l, ok := f.locks[loc]; ok && time.Now().Before(l.exp) {
		lock = l.v
	}
	return value, lock
}

func (f *fakeStore) GetOrLock(ctx context.Context, loc, token string, ttl time.Duration, skip []byte) (Claim, error) {
	if err := f.enter(ctx, "get_or_lock", KeysBoth); err != nil {
		return Claim{}, err
	}
	f.mu.Lock()
	var c Claim
	v, lock := f.current(loc)
	switch {
	case f.wrong.Load():
		c.Malformed = fmt.Errorf("%w: WRONGTYPE", ErrMalformed)
		v = ""
	}
	if v != "" && v != string(skip) {
		c.Value = []byte(v)
	} else if lock == "" {
		f.locks[loc] = stored{token, time.Now().Add(ttl)}
		c.Locked = true
	}
	f.mu.Unlock()
	if c.Value == nil && f.afterEmptyRead != nil {
		f.once.Do(func() { f.afterEmptyRead(loc) })
	}
	return c, nil
}

func (f *fakeStore) Extend(ctx context.Context, loc, token string, ttl time.Duration) (bool, error) {
	if err := f.enter(ctx, "extend", KeysLock); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, lock := f.current(loc); lock != token {
		return false, nil
	}
	f.locks[loc] = stored{token, time.Now().Add(ttl)}
	return true, nil
}

func (f *fakeStore) Publish(ctx context.Context, loc, token string, value []byte, ttl time.Duration, skip []byte) ([]byte, bool, error) {
	if err := f.enter(ctx, "publish", KeysBoth); err != nil {
		return nil, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, lock := f.current(loc)
	if f.wrong.Load() {
		v = ""
	}
	if (token != "" && lock == token) || (lock == "" && (v == "" || v == string(skip))) {
		f.sets.Add(1)
		f.values[loc] = stored{string(value), time.Now().Add(ttl)}
		if lock == token {
			delete(f.locks, loc)
		}
		f.wrong.Store(false)
		return nil, true, nil
	}
	if v == "" {
		return nil, false, nil
	}
	return []byte(v), false, nil
}

func (f *fakeStore) Unlock(ctx context.Context, loc, token string) error {
	if err := f.enter(ctx, "unlock", KeysLock); err != nil {
		return err
	}
	f.unlock(loc, token)
	return nil
}

func (f *fakeStore) unlock(loc, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.locks[loc].v == token {
		delete(f.locks, loc)
	}
}

// lock takes loc's lock for another replica, as GetOrLock would.
func (f *fakeStore) lock(loc, token string, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.locks[loc] = stored{token, time.Now().Add(ttl)}
}

func (f *fakeStore) put(loc, value string, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[loc] = stored{value, time.Now().Add(ttl)}
}

func (f *fakeStore) value(loc string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.values[loc].v
}

func (f *fakeStore) locked(loc string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, lock := f.current(loc)
	return lock != ""
}

// events counts store events by kind.
type events struct {
	mu sync.Mutex
	n  map[StoreEventKind]int
}

func (e *events) on(ev StoreEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[StoreEventKind]int{}
	}
	e.n[ev.Kind]++
}

func (e *events) count(k StoreEventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[k]
}

func replica(t *testing.T, store ResultStore, p *fakeProber, ev *events, mod ...func(*Config)) *Table {
	t.Helper()
	cfg := Config{Gateways: exampleGateways(), Prober: p, ProbeID: "tcp", Store: store, OnStore: ev.on, Recheck: -1}
	for _, m := range mod {
		m(&cfg)
	}
	s := newSel(t, cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

// One replica's probe run answers the other's first query with no probe
// there; the second query there is a local hit.
func TestSharedResultServesOtherReplica(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	pa, pb := exampleProber(), exampleProber()
	a, b := replica(t, store, pa, ev), replica(t, store, pb, ev)
	if sel := a.Select(context.Background(), "loc"); sel.Source != Probed {
		t.Fatalf("a: %v", sel.Source)
	}
	a.Close() // the result is written once the run's queries have it: wait for it
	if store.value("loc") == "" {
		t.Fatal("nothing stored")
	}
	sel := b.Select(context.Background(), "loc")
	if sel.Source != FromReplica || !sel.Source.Fresh() || pb.calls.Load() != 0 {
		t.Fatalf("b: %v after %d probes", sel.Source, pb.calls.Load())
	}
	if got := sel.Names(); !slices.Equal(got, []string{"gw2", "gw1", "gw3", "gw4"}) || sel.RTTs[1] != 132*ms {
		t.Fatalf("b's order %v rtts %v", got, sel.RTTs)
	}
	calls := store.calls.Load()
	if sel := b.Select(context.Background(), "loc"); sel.Source != Cached || store.calls.Load() != calls {
		t.Fatalf("second query on b: %v, %d store calls", sel.Source, store.calls.Load()-calls)
	}
	snap := b.Snapshot(10)
	if snap.Total != 1 || !snap.Locations[0].FromReplica || !snap.Locations[0].Fresh || snap.Runs != 0 || !snap.StoreUp {
		t.Fatalf("b's snapshot %+v", snap)
	}
}

// First queries for one location on two replicas at once: one probe run in
// all; the replica that waited gets the result from the store, fresh.
func TestConcurrentReplicasProbeOnce(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	rtts := map[string]time.Duration{"a:1": 30 * ms, "b:1": 10 * ms, "c:1": 50 * ms, "d:1": 70 * ms}
	pa, pb := newSleepingProber(rtts), newSleepingProber(rtts)
	var probes atomic.Int64
	count := func(p *sleepingProber) countingProber { return countingProber{p, &probes} }
	mk := func(p *sleepingProber) *Table {
		s := newSel(t, Config{Gateways: exampleGateways(), Prober: count(p), ProbeID: "tcp", Store: store, OnStore: ev.on, Recheck: -1, StorePoll: 5 * ms, AnswerDeadline: 5 * time.Second})
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := mk(pa), mk(pb)
	var wg sync.WaitGroup
	sels := make([]Selection, 2)
	start := make(chan struct{})
	for i, s := range []*Table{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sels[i] = s.Select(context.Background(), "loc")
		}()
	}
	close(start)
	wg.Wait()
	if probes.Load() != 12 {
		t.Fatalf("%d probes on both replicas, want one run (12)", probes.Load())
	}
	srcs := []Source{sels[0].Source, sels[1].Source}
	slices.Sort(srcs)
	if !slices.Equal(srcs, []Source{Probed, FromReplica}) || ev.count(StoreLockWait) != 1 {
		t.Fatalf("sources %v, %d lock waits", srcs, ev.count(StoreLockWait))
	}
}

type countingProber struct {
	*sleepingProber
	n *atomic.Int64
}

func (c countingProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	c.n.Add(1)
	return c.sleepingProber.Probe(ctx, addr)
}

// A store that fails: the replica probes as without one, counts the
// errors, reports the transition once, leaves the store alone for
// StoreRetry, and uses it again once it answers.
func TestStoreDownProbesLocally(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	store.down.Store(true)
	p := exampleProber()
	now := time.Now()
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	s := replica(t, store, p, ev)
	s.now = func() time.Time { return time.Unix(0, clock.Load()) }
	for i, loc := range []string{"l1", "l2"} {
		if sel := s.Select(context.Background(), loc); sel.Source != Probed {
			t.Fatalf("%s: %v", loc, sel.Source)
		}
		if p.calls.Load() != int64(12*(i+1)) {
			t.Fatalf("%d probes", p.calls.Load())
		}
	}
	if ev.count(StoreError) != 1 || ev.count(StoreDown) != 1 || store.calls.Load() != 1 || s.StoreHealthy() {
		t.Fatalf("errors %d, down %d, calls %d (the second location must not try the resting store), healthy %v", ev.count(StoreError), ev.count(StoreDown), store.calls.Load(), s.StoreHealthy())
	}
	store.down.Store(false)
	clock.Add(int64(DefaultStoreRetry))
	if sel := s.Select(context.Background(), "l3"); sel.Source != Probed {
		t.Fatalf("l3: %v", sel.Source)
	}
	s.Close()
	if ev.count(StoreUp) != 1 || store.value("l3") == "" || !s.StoreHealthy() {
		t.Fatalf("up %d, l3 stored %q, healthy %v", ev.count(StoreUp), store.value("l3"), s.StoreHealthy())
	}
}

// A store that hangs costs at most StoreTimeout per call; queries are
// answered from a local run. Each call is timed inside the store, from its
// start to its return, and must end within 10× StoreTimeout (a bound on the
// timeout's cost, not a performance claim: a call that waits for anything
// but its own bounded context blocks until Close, 30 s here; a busy make
// test, with other tests on both cores, measured 346 ms for 100).
func TestStoreHangingIsBounded(t *testing.T) {
	const timeout = 100 * ms
	store, ev := &timedStore{fakeStore: newFakeStore()}, &events{}
	store.hang.Store(true)
	s := replica(t, store, exampleProber(), ev, func(c *Config) { c.StoreTimeout = timeout; c.StoreRetry = time.Nanosecond })
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sel := s.Select(context.Background(), fmt.Sprintf("loc%d", i)); sel.Source != Probed {
				t.Errorf("loc%d: %v", i, sel.Source)
			}
		}()
	}
	wg.Wait()
	for deadline := time.Now().Add(30 * time.Second); s.Snapshot(0).Total < 4 && time.Now().Before(deadline); {
		time.Sleep(10 * ms) // the flights end (with a slow store, after the queries fell back)
	}
	s.Close()
	if ev.count(StoreError) < 1 {
		t.Fatalf("%d errors", ev.count(StoreError))
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.took) == 0 {
		t.Fatal("no store call")
	}
	for i, d := range store.took {
		if d > 10*timeout {
			t.Errorf("store call %d of %d took %v; the store timeout is %v (bound: 10× that)", i+1, len(store.took), d, timeout)
		}
	}
}

// timedStore records how long each GetOrLock and Publish took.
type timedStore struct {
	*fakeStore
	mu   sync.Mutex
	took []time.Duration
}

func (ts *timedStore) record(start time.Time) {
	ts.mu.Lock()
	ts.took = append(ts.took, time.Since(start))
	ts.mu.Unlock()
}

func (ts *timedStore) GetOrLock(ctx context.Context, loc, token string, ttl time.Duration, skip []byte) (Claim, error) {
	defer ts.record(time.Now())
	return ts.fakeStore.GetOrLock(ctx, loc, token, ttl, skip)
}

func (ts *timedStore) Publish(ctx context.Context, loc, token string, value []byte, ttl time.Duration, skip []byte) ([]byte, bool, error) {
	defer ts.record(time.Now())
	return ts.fakeStore.Publish(ctx, loc, token, value, ttl, skip)
}

// Values that do not validate are ignored and counted; the location is
// probed and the value replaced by a good one. Values of another probe or
// other gateways are stale: ignored, counted apart.
func TestStoreValuesValidated(t *testing.T) {
	good := func(mod func(*storedEntry)) string {
		v := storedEntry{Version: 1, Probe: "tcp", Gateways: map[string]string{"gw1": "a:1", "gw2": "b:1", "gw3": "c:1", "gw4": "d:1"},
			At: time.Now().Add(-time.Minute), Order: []string{"gw1"}, RTTs: map[string]float64{"gw1": 5}}
		mod(&v)
		b, _ := json.Marshal(v)
		return string(b)
	}
	for _, tc := range []struct {
		name, value string
		kind        StoreEventKind
	}{
		{"garbage", "\x00not json", StoreMalformed},
		{"wrong type", `["a list"]`, StoreMalformed},
		{"version", good(func(v *storedEntry) { v.Version = 9 }), StoreMalformed},
		{"unknown gateway", good(func(v *storedEntry) { v.RTTs["gw9"] = 3 }), StoreMalformed},
		{"unknown in order", good(func(v *storedEntry) { v.Order = []string{"gw9"} }), StoreMalformed},
		{"negative rtt", good(func(v *storedEntry) { v.RTTs["gw1"] = -1 }), StoreMalformed},
		{"huge rtt", good(func(v *storedEntry) { v.RTTs["gw1"] = 1e300 }), StoreMalformed},
		{"future", good(func(v *storedEntry) { v.At = time.Now().Add(time.Hour) }), StoreMalformed},
		{"no time", good(func(v *storedEntry) { v.At = time.Time{} }), StoreMalformed},
		{"nothing measured", good(func(v *storedEntry) { v.RTTs = nil }), StoreMalformed},
		{"other probe", good(func(v *storedEntry) { v.Probe = "https /" }), StoreStale},
		{"other address", good(func(v *storedEntry) { v.Gateways["gw1"] = "z:1" }), StoreStale},
		{"extra gateway", good(func(v *storedEntry) { v.Gateways["gw9"] = "z:1" }), StoreStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, ev := newFakeStore(), &events{}
			store.put("loc", tc.value, time.Hour)
			p := exampleProber()
			s := replica(t, store, p, ev)
			if sel := s.Select(context.Background(), "loc"); sel.Source != Probed || p.calls.Load() != 12 {
				t.Fatalf("%v after %d probes", sel.Source, p.calls.Load())
			}
			s.Close()
			if ev.count(tc.kind) != 1 || ev.count(StoreMalformed)+ev.count(StoreStale) != 1 {
				t.Fatalf("events %v", ev.n)
			}
			if v := store.value("loc"); !strings.Contains(v, `"gw2":132`) {
				t.Fatalf("value not replaced: %s", v)
			}
		})
	}
	// The good value itself answers.
	store, ev := newFakeStore(), &events{}
	store.put("loc", good(func(*storedEntry) {}), time.Hour)
	p := exampleProber()
	s := replica(t, store, p, ev)
	if sel := s.Select(context.Background(), "loc"); sel.Source != FromReplica || p.calls.Load() != 0 || sel.Gateways[sel.Order[0]].Name != "gw1" {
		t.Fatalf("%v after %d probes", sel.Source, p.calls.Load())
	}
}

// A key of another type is a bad value, not a store that is down.
func TestStoreWrongTypeIsMalformed(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	store.wrong.Store(true)
	p := exampleProber()
	s := replica(t, store, p, ev)
	if sel := s.Select(context.Background(), "loc"); sel.Source != Probed || p.calls.Load() != 12 {
		t.Fatalf("%v after %d probes", sel.Source, p.calls.Load())
	}
	s.Close()
	if ev.count(StoreMalformed) != 1 || ev.count(StoreError) != 0 || !s.StoreHealthy() || store.value("loc") == "" {
		t.Fatalf("events %v, healthy %v, stored %q", ev.n, s.StoreHealthy(), store.value("loc"))
	}
}

// A lock held by a replica that never writes (it died): the waiting
// replica's query falls back at the answer deadline as today, and the run
// starts here once the lock expires.
func TestDeadLockHolderFallsBackThenProbes(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	store.lock("loc", "dead replica", 300*ms)
	p := exampleProber()
	s := replica(t, store, p, ev, func(c *Config) { c.AnswerDeadline = 50 * ms; c.Deadline = 300 * ms; c.StorePoll = 10 * ms })
	sel := s.Select(context.Background(), "loc")
	if sel.Source != Configured || sel.Why != WhyDeadline || p.calls.Load() != 0 {
		t.Fatalf("%v %v after %d probes", sel.Source, sel.Why, p.calls.Load())
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Select(context.Background(), "loc").Source != Cached {
		if time.Now().After(deadline) {
			t.Fatal("never probed after the lock expired")
		}
		time.Sleep(10 * ms)
	}
	if p.calls.Load() != 12 || ev.count(StoreLockWait) != 1 {
		t.Fatalf("%d probes, %d lock waits", p.calls.Load(), ev.count(StoreLockWait))
	}
}

func FuzzDecodeStored(f *testing.F) {
	f.Add([]byte(`{"v":1,"probe":"tcp","gateways":{"gw1":"a:1"},"at":"2026-01-01T00:00:00Z","order":["gw1"],"rtts_ms":{"gw1":3}}`))
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	cfg := Config{Gateways: exampleGateways(), ProbeID: "tcp"}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := decodeStored(data, &cfg, time.Now())
		if err != nil {
			return
		}
		if len(res.RTTs) != len(cfg.Gateways) || !slices.ContainsFunc(res.RTTs, func(d time.Duration) bool { return d > 0 }) {
			t.Fatalf("accepted %s as %+v", data, res)
		}
	})
}
