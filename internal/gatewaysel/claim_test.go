package gatewaysel

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// storedValue is a location's value as another replica's run with rtts
// (gateway name → RTT) writes it.
func storedValue(t *testing.T, rtts map[string]time.Duration) string {
	t.Helper()
	gws := exampleGateways()
	res := &gatewayorder.Result{Gateways: gws, RTTs: make([]time.Duration, len(gws)), At: time.Now()}
	for i, g := range gws {
		res.RTTs[i] = rtts[g.Name]
	}
	res.Order = gatewayorder.Order(gws, res.RTTs, false)
	data, err := encodeStored(res, &Config{ProbeID: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// otherRTTs is another replica's measurement: gw3 first, where
// exampleProber measures gw2 first.
var otherRTTs = map[string]time.Duration{"gw1": 40 * ms, "gw2": 30 * ms, "gw3": 10 * ms, "gw4": 20 * ms}

// The interleaving that made two replicas probe one location: the waiter
// finds no value, and the holder writes its result and releases the lock
// before the waiter's next step. With get-or-lock one atomic step, that
// next step finds the value: no probe here, the holder's result answers.
// (On the previous code, a GET then a SET NX, this test fails: the waiter
// took the released lock and probed, 12 probes.)
func TestWaiterNeverProbesWhatTheHolderWrote(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	value := storedValue(t, otherRTTs)
	store.lock("loc", "holder", time.Minute)
	store.afterEmptyRead = func(loc string) {
		store.put(loc, value, time.Hour)
		store.unlock(loc, "holder")
	}
	p := exampleProber()
	s := replica(t, store, p, ev, func(c *Config) { c.StorePoll = 5 * ms })
	sel := s.Select(context.Background(), "loc")
	if p.calls.Load() != 0 || sel.Source != FromReplica {
		t.Fatalf("%v after %d probes: the waiter probed although the holder's result was there", sel.Source, p.calls.Load())
	}
	if got := sel.Names(); !slices.Equal(got, []string{"gw3", "gw4", "gw2", "gw1"}) {
		t.Fatalf("order %v, want the holder's", got)
	}
}

// overrunProber ignores its context: a probe that outlives the run's
// deadline (a late run).
type overrunProber struct {
	d     time.Duration
	calls atomic.Int64
}

func (p *overrunProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	p.calls.Add(1)
	time.Sleep(p.d)
	return p.d + time.Duration(addr[0])*time.Microsecond, nil
}

// A run that outlives its lock's first lifetime keeps the lock (the holder
// extends it while the run goes): the other replica waits for its result
// and answers it, and no second run starts.
func TestLateRunKeepsItsLock(t *testing.T) {
	store := newFakeStore()
	mod := func(c *Config) {
		c.Deadline, c.StoreTimeout, c.StorePoll, c.AnswerDeadline, c.Probes = 600*ms, 500*ms, 5*ms, 2*time.Second, 1
	}
	// The lock lives 1.6 s (the deadline and two store timeouts) unless
	// extended; the run lasts 2.2 s; the waiting replica gives up on the
	// holder, and its holder stops extending, after 2.8 s (twice the
	// deadline and the lock's lifetime). Each bound is 600 ms from the
	// run's end, and a store call may take 500 ms: on a busy host (load
	// average 30) margins of 300 ms and store calls of 20 and 100 ms ran
	// out, and a replica whose store call fails probes locally, as its rule
	// says, which this test would take for a second run.
	late := &overrunProber{d: 2200 * ms}
	a := replica(t, store, nil, &events{}, mod, func(c *Config) { c.Prober = late })
	pb := exampleProber()
	b := replica(t, store, pb, &events{}, mod)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Select(context.Background(), "loc") }()
	for !store.locked("loc") {
		time.Sleep(ms)
	}
	// b's query falls back at its wait (the deadline); its flight waits on.
	b.Select(context.Background(), "loc")
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for !b.Snapshot(1).Store || b.Snapshot(1).Total == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never got a result")
		}
		time.Sleep(5 * ms)
	}
	if l := b.Snapshot(1).Locations[0]; pb.calls.Load() != 0 || !l.FromReplica {
		t.Fatalf("b: shared %v after %d probes of its own; want a's late result, no second run", l.FromReplica, pb.calls.Load())
	}
	if store.sets.Load() != 1 {
		t.Fatalf("%d writes", store.sets.Load())
	}
}

// gateProber answers exampleProber's RTTs once open is closed.
type gateProber struct {
	*fakeProber
	open chan struct{}
}

func (p gateProber) Probe(ctx context.Context, addr string) (time.Duration, error) {
	<-p.open
	return p.fakeProber.Probe(ctx, addr)
}

// A run that lost its lock while it probed (it expired, another replica
// took it and wrote first) answers the stored result, not its own: every
// replica answers one order for the location.
func TestLostRaceAnswersStoredResult(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	p := gateProber{exampleProber(), make(chan struct{})}
	s := replica(t, store, nil, ev, func(c *Config) { c.Prober = p })
	go func() {
		for !store.locked("loc") {
			time.Sleep(ms)
		}
		store.mu.Lock()
		delete(store.locks, "loc") // expired; another replica probed and wrote
		store.mu.Unlock()
		store.put("loc", storedValue(t, otherRTTs), time.Hour)
		close(p.open)
	}()
	sel := s.Select(context.Background(), "loc")
	if got := sel.Names(); sel.Source != FromReplica || !slices.Equal(got, []string{"gw3", "gw4", "gw2", "gw1"}) {
		t.Fatalf("%v %v; want the stored result (gw3 first)", sel.Source, got)
	}
	if store.sets.Load() != 0 || ev.count(StoreAdopted) != 1 {
		t.Fatalf("%d writes over the other's value, %d adopted", store.sets.Load(), ev.count(StoreAdopted))
	}
	if snap := s.Snapshot(1); !snap.Locations[0].FromReplica || snap.Runs != 1 {
		t.Fatalf("snapshot %+v", snap)
	}
}

// A run whose result could not be the stored one — another replica held
// the lock when it ended, or the store was down — answers its own result
// and converges at the next reconcile (the re-check timer): on the other's
// stored value once there, or by writing its own where nothing is stored.
func TestPendingResultsConverge(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	p := gateProber{exampleProber(), make(chan struct{})}
	s := replica(t, store, nil, ev, func(c *Config) { c.StoreRetry = 10 * ms; c.Prober = p })
	go func() {
		for !store.locked("loc") {
			time.Sleep(ms)
		}
		store.lock("loc", "other", time.Minute) // another replica took it over (ours expired)
		close(p.open)
	}()
	if sel := s.Select(context.Background(), "loc"); sel.Source != Probed || sel.Gateways[sel.Order[0]].Name != "gw2" {
		t.Fatalf("%v: want its own run's result while the other's is not there", sel.Source)
	}
	store.put("loc", storedValue(t, otherRTTs), time.Hour)
	store.unlock("loc", "other")
	s.reconcile()
	sel := s.Select(context.Background(), "loc")
	if got := sel.Names(); sel.Source != Cached || !slices.Equal(got, []string{"gw3", "gw4", "gw2", "gw1"}) || !s.Snapshot(1).Locations[0].FromReplica {
		t.Fatalf("after reconcile: %v %v; want the stored result", sel.Source, got)
	}

	// Probed while the store was down: written once it answers.
	store.down.Store(true)
	if sel := s.Select(context.Background(), "down"); sel.Source != Probed {
		t.Fatalf("%v", sel.Source)
	}
	store.down.Store(false)
	time.Sleep(20 * ms) // the store's rest after the error
	s.reconcile()
	if v := store.value("down"); v == "" {
		t.Fatal("the result probed while the store was down was not written when it came back")
	}
	if store.sets.Load() != 1 {
		t.Fatalf("%d writes", store.sets.Load())
	}
}

// A store that refuses one kind of key (an ACL user allowed only the
// values): the replica probes locally, reports the trouble once with the
// keys, operation and reason, keeps reporting errors (not transitions)
// while it lasts, and reports the return once.
func TestStoreTroubleNamesKeysOnce(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	store.refuse.Store(uint32(KeysLock))
	p := exampleProber()
	var downs []StoreEvent
	var mu sync.Mutex
	s := replica(t, store, p, ev, func(c *Config) {
		c.StoreRetry = 5 * ms
		c.OnStore = func(e StoreEvent) {
			ev.on(e)
			if e.Kind == StoreDown || e.Kind == StoreUp {
				mu.Lock()
				downs = append(downs, e)
				mu.Unlock()
			}
		}
	})
	for i, loc := range []string{"l1", "l2", "l3"} {
		if sel := s.Select(context.Background(), loc); sel.Source != Probed || p.calls.Load() != int64(12*(i+1)) {
			t.Fatalf("%s: %v after %d probes", loc, sel.Source, p.calls.Load())
		}
		time.Sleep(10 * ms)
	}
	if ev.count(StoreError) < 3 || ev.count(StoreDown) != 1 || s.StoreHealthy() {
		t.Fatalf("errors %d, down %d, healthy %v", ev.count(StoreError), ev.count(StoreDown), s.StoreHealthy())
	}
	tr := s.Snapshot(0).Troubles
	if len(tr) != 1 || tr[0].Keys != KeysLock || tr[0].Op != "get_or_lock" || tr[0].Reason != "noperm" || tr[0].Since.IsZero() {
		t.Fatalf("troubles %+v", tr)
	}
	if d := downs[0].Trouble; d.Keys != KeysLock || d.Reason != "noperm" || d.Op != "get_or_lock" {
		t.Fatalf("down event %+v", d)
	}
	store.refuse.Store(0)
	if sel := s.Select(context.Background(), "l4"); sel.Source != Probed {
		t.Fatalf("l4: %v", sel.Source)
	}
	s.Close()
	if ev.count(StoreUp) != 1 || !s.StoreHealthy() || len(s.Snapshot(0).Troubles) != 0 || store.value("l4") == "" {
		t.Fatalf("up %d, healthy %v, troubles %+v", ev.count(StoreUp), s.StoreHealthy(), s.Snapshot(0).Troubles)
	}
}

// A success on some keys clears only their trouble: values answering do
// not clear the locks' (no flapping between down and up).
func TestStoreTroubleClearsOnlyTouchedKeys(t *testing.T) {
	s, ev := newSel(t, Config{Gateways: exampleGateways(), Prober: exampleProber(), Store: newFakeStore(), Recheck: -1}), &events{}
	defer s.Close()
	cfg := s.Config()
	cfg.OnStore = ev.on
	refused := &StoreTrouble{Op: "publish", Keys: KeysLock, Reason: "noperm", Err: errDown}
	s.storeDone(&cfg, "l", "publish", KeysBoth, refused)
	s.storeDone(&cfg, "l", "get_or_lock", KeysValue, nil)
	if s.StoreHealthy() || ev.count(StoreUp) != 0 {
		t.Fatal("a value read cleared the locks' trouble")
	}
	s.storeDone(&cfg, "l", "get_or_lock", KeysBoth, nil)
	if !s.StoreHealthy() || ev.count(StoreUp) != 1 || ev.count(StoreDown) != 1 {
		t.Fatalf("healthy %v, up %d, down %d", s.StoreHealthy(), ev.count(StoreUp), ev.count(StoreDown))
	}
}

// The re-check timer reconciles by itself: a result probed while the
// store was down is written within one re-check interval of the store
// answering, with no query.
func TestReconcileRunsOnTheRecheckTimer(t *testing.T) {
	store, ev := newFakeStore(), &events{}
	store.down.Store(true)
	s := replica(t, store, exampleProber(), ev, func(c *Config) { c.Recheck = 50 * ms; c.StoreRetry = 10 * ms })
	s.Start()
	if sel := s.Select(context.Background(), "loc"); sel.Source != Probed {
		t.Fatalf("%v", sel.Source)
	}
	store.down.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for store.value("loc") == "" {
		if time.Now().After(deadline) {
			t.Fatal("never written after the store came back")
		}
		time.Sleep(5 * ms)
	}
}

// pausedStore is a store stopped as a SIGSTOPped Redis is: while paused,
// each call waits until its context ends and fails (a timeout), and is run
// when resume is called, in the order made (Redis runs what waited in its
// sockets once it goes on, replying to no one).
type pausedStore struct {
	*fakeStore
	mu     sync.Mutex
	paused bool
	queued []func()
}

// wait, while the store is paused, queues op and waits for ctx to end; it
// reports whether it did.
func (p *pausedStore) wait(ctx context.Context, op func()) bool {
	p.mu.Lock()
	if !p.paused {
		p.mu.Unlock()
		return false
	}
	p.queued = append(p.queued, op)
	p.mu.Unlock()
	<-ctx.Done()
	return true
}

func (p *pausedStore) resume() {
	p.mu.Lock()
	q := p.queued
	p.paused, p.queued = false, nil
	p.mu.Unlock()
	for _, op := range q {
		op()
	}
}

func (p *pausedStore) GetOrLock(ctx context.Context, loc, token string, ttl time.Duration, skip []byte) (Claim, error) {
	if p.wait(ctx, func() { p.fakeStore.GetOrLock(context.Background(), loc, token, ttl, skip) }) {
		return Claim{}, ctx.Err()
	}
	return p.fakeStore.GetOrLock(ctx, loc, token, ttl, skip)
}

func (p *pausedStore) Extend(ctx context.Context, loc, token string, ttl time.Duration) (bool, error) {
	if p.wait(ctx, func() { p.fakeStore.Extend(context.Background(), loc, token, ttl) }) {
		return false, ctx.Err()
	}
	return p.fakeStore.Extend(ctx, loc, token, ttl)
}

func (p *pausedStore) Publish(ctx context.Context, loc, token string, value []byte, ttl time.Duration, skip []byte) ([]byte, bool, error) {
	if p.wait(ctx, func() { p.fakeStore.Publish(context.Background(), loc, token, value, ttl, skip) }) {
		return nil, false, ctx.Err()
	}
	return p.fakeStore.Publish(ctx, loc, token, value, ttl, skip)
}

func (p *pausedStore) Unlock(ctx context.Context, loc, token string) error {
	if p.wait(ctx, func() { p.fakeStore.Unlock(context.Background(), loc, token) }) {
		return ctx.Err()
	}
	return p.fakeStore.Unlock(ctx, loc, token)
}

// Issue 48: two replicas probe a new location while the store is paused
// and pick different first gateways. On resuming, the store runs a's
// get-or-lock, which a gave up on: the lock is a's, and no run of a's
// extends or releases it. Rule 5: each replica's first reconcile once the
// store answers takes its result there (even though the store still rests
// after the errors: StoreRetry is an hour here), a's under the token of
// the run the lock was taken for; b, reconciling first, finds a's lock and
// reads a's result at its next step. So the worst case, b, a, b, agrees
// after b's second step: two re-check intervals. (With the lock left to
// expire, as before, both answered their own results for its 7.5 s; with
// the store's rest in force, nothing was reconciled.)
func TestPausedStoreConvergesWithinTwoReconciles(t *testing.T) {
	store := &pausedStore{fakeStore: newFakeStore(), paused: true}
	mod := func(c *Config) { c.StoreTimeout, c.StoreRetry = 20*ms, time.Hour }
	a := replica(t, store, exampleProber(), &events{}, mod)
	pb := &fakeProber{rtts: map[string]time.Duration{"a:1": 40 * ms, "b:1": 30 * ms, "c:1": 10 * ms, "d:1": 20 * ms}}
	b := replica(t, store, pb, &events{}, mod)
	first := func(s *Table) string {
		sel := s.Select(context.Background(), "loc")
		return sel.Gateways[sel.Order[0]].Name
	}
	if fa, fb := first(a), first(b); fa != "gw2" || fb != "gw3" {
		t.Fatalf("with the store paused: a %s first, b %s; want each its own run (gw2, gw3)", fa, fb)
	}
	a.Select(context.Background(), "loc2") // probed with the store resting: no call
	store.resume()
	if !store.locked("loc") {
		t.Fatal("the paused get-or-lock took no lock on resuming")
	}
	for i, s := range []*Table{b, a, b} {
		s.reconcile()
		t.Logf("reconcile %d: a %s first, b %s, stored %.40q, locked %v", i+1, first(a), first(b), store.value("loc"), store.locked("loc"))
	}
	if fa, fb := first(a), first(b); fa != "gw2" || fb != "gw2" || store.locked("loc") {
		t.Fatalf("after reconciling b, a, b: a %s first, b %s, lock held %v; want both a's stored result (gw2) and the lock released", fa, fb, store.locked("loc"))
	}
	if !b.Snapshot(1).Locations[0].FromReplica || store.value("loc2") == "" || store.sets.Load() != 2 {
		t.Fatalf("b's result shared %v; loc2 stored %q; %d writes (want 2: the step's first call answered, so the rest ended)",
			b.Snapshot(1).Locations[0].FromReplica, store.value("loc2"), store.sets.Load())
	}
}
