package pubsel

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// replica is one process of a cluster: its own State (tracker, local
// table) and a selector, sharing a store with the others.
type replica struct {
	st  *State
	sel *Selector[*up]
}

func newReplica(t testing.TB, store Store, pool []*up, rtts ...time.Duration) *replica {
	t.Helper()
	s := settings(32 * ms)
	s.StickyStore = &StickyStoreConfig{Store: store, Prefix: "edgesteer:latency_bucket:apps", Recheck: 20 * ms, Timeout: 50 * ms,
		DownAfter: 100 * ms}
	st, err := NewState(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	l, err := st.Lease(t, s)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{st: st, sel: &Selector[*up]{Tracker: st.Tracker(), Holder: l.Holder(), Host: upHost{},
		Sticky: st.Table(), StickyStore: st.StickyStore()}}
	r.sel.SelectUnpinned(pool, 0) // registers the pool
	for i, d := range rtts {
		measure(t, st.Tracker(), pool[i].addr, d)
	}
	return r
}

func (r *replica) pick(t *testing.T, pool []*up, user, app string) (*up, Decision) {
	t.Helper()
	u, d, ok := r.sel.Select(pool, user, app, time.Now().UnixNano())
	if !ok {
		t.Fatalf("no pick for %s/%s", user, app)
	}
	return u, d
}

// A pair picked on one replica is used by the others: one store read on
// their local miss, none on their local hits.
func TestStickyStorePinAcrossReplicas(t *testing.T) {
	store := NewMemStore()
	pool := pubs(4)
	rtts := []time.Duration{5 * ms, 6 * ms, 7 * ms, 8 * ms} // all in [0,32): a random pick
	a, b, c := newReplica(t, store, pool, rtts...), newReplica(t, store, pool, rtts...), newReplica(t, store, pool, rtts...)
	for i := range 50 {
		user := fmt.Sprint("user-", i)
		first, d := a.pick(t, pool, user, "app")
		if d.Sticky || d.FromStore {
			t.Fatalf("first pick of %s: %+v", user, d)
		}
		for _, r := range []*replica{b, c} {
			u, d := r.pick(t, pool, user, "app")
			if u != first || !d.Sticky || !d.FromStore {
				t.Fatalf("%s on another replica: %s %+v, first went to %s", user, u.addr, d, first.addr)
			}
		}
		calls := store.Calls()
		for _, r := range []*replica{a, b, c} {
			if u, d := r.pick(t, pool, user, "app"); u != first || !d.Sticky || d.FromStore {
				t.Fatalf("%s local hit: %s %+v", user, u.addr, d)
			}
		}
		if store.Calls() != calls {
			t.Fatalf("local hits made %d store calls", store.Calls()-calls)
		}
	}
	if n := store.Len(); n != 50 {
		t.Fatalf("store holds %d pairs, want 50", n)
	}
	sa, sb := a.st.StickyStoreStats(), b.st.StickyStoreStats()
	if sa.Misses.Load() != 50 || sa.Writes.Load() != 50 || sb.StoreHits.Load() != 50 || sb.Misses.Load() != 0 {
		t.Fatalf("stats: a misses %d writes %d; b shared %d misses %d", sa.Misses.Load(), sa.Writes.Load(),
			sb.StoreHits.Load(), sb.Misses.Load())
	}
	// A replica restarted with an empty table follows the store.
	d := newReplica(t, store, pool, rtts...)
	for i := range 50 {
		user := fmt.Sprint("user-", i)
		want, _ := a.pick(t, pool, user, "app")
		if u, dd := d.pick(t, pool, user, "app"); u != want || !dd.FromStore {
			t.Fatalf("%s on the restarted replica: %s %+v, want %s", user, u.addr, dd, want.addr)
		}
	}
}

// A stored publisher inactive here (or unavailable) is re-picked and the
// entry rewritten; one that is not a publisher of the pool, too long, not
// printable or of another type is ignored, counted and overwritten.
func TestStickyStoreStaleAndMalformed(t *testing.T) {
	store := NewMemStore()
	pool := pubs(3)
	r := newReplica(t, store, pool, 5*ms, 6*ms, 0) // publisher3's round failed: inactive
	key := func(u string) string { return StickyStoreKey("edgesteer:latency_bucket:apps", u, "app") }

	store.Put(key("stale"), "publisher3:443")
	u, d := r.pick(t, pool, "stale", "app")
	if u == pool[2] || d.Sticky {
		t.Fatalf("inactive stored publisher: %s %+v", u.addr, d)
	}
	if v, _ := store.Value(key("stale")); v != u.addr {
		t.Fatalf("entry not rewritten: %q, picked %s", v, u.addr)
	}
	pool[1].down = true
	store.Put(key("down"), "publisher2:443")
	if u, _ := r.pick(t, pool, "down", "app"); u != pool[0] {
		t.Fatalf("unavailable stored publisher: picked %s", u.addr)
	}
	pool[1].down = false
	if got := r.st.StickyStoreStats().Stale.Load(); got != 2 {
		t.Fatalf("stale %d, want 2", got)
	}

	bad := map[string]string{
		"foreign": "10.9.9.9:443", "long": strings.Repeat("a", MaxValueLen+1) + ":443",
		"ctl": "publisher1:443\n", "empty": "",
	}
	for user, v := range bad {
		store.Put(key(user), v)
		u, d := r.pick(t, pool, user, "app")
		if d.FromStore || d.Sticky {
			t.Fatalf("%s: value %q trusted: %s %+v", user, v, u.addr, d)
		}
		if got, _ := store.Value(key(user)); got != u.addr {
			t.Fatalf("%s: entry %q not rewritten to %s", user, got, u.addr)
		}
	}
	store.PutOther(key("hash"))
	if _, d := r.pick(t, pool, "hash", "app"); d.Sticky {
		t.Fatalf("wrong type trusted: %+v", d)
	}
	if got := r.st.StickyStoreStats().Malformed.Load(); got != uint64(len(bad)+1) {
		t.Fatalf("malformed %d, want %d", got, len(bad)+1)
	}
	if r.st.StickyStore().Health().Healthy != true || r.st.StickyStoreStats().Errors.Load() != 0 {
		t.Fatal("bad values marked the store down")
	}
}

// A store that fails or hangs never fails a pick nor holds one past two
// timeouts (the read and the write of a new pick; asserted ≤ 3×); it is
// marked down only after DownFailures calls without an answer over
// DownAfter, then not called per request; a ping brings it back, new
// pairs are shared again, and the pins made meanwhile are reconciled.
func TestStickyStoreDownAndBack(t *testing.T) {
	store := NewMemStore()
	pool := pubs(3)
	a, b := newReplica(t, store, pool, 5*ms, 6*ms, 7*ms), newReplica(t, store, pool, 5*ms, 6*ms, 7*ms)
	timeout := a.st.StickyStore().cfg.Timeout
	downAfter := a.st.StickyStore().cfg.DownAfter
	for _, mode := range []string{"down", "hang"} {
		if mode == "down" {
			store.SetDown(true)
		} else {
			store.SetHang(true)
		}
		start := time.Now()
		picks := 0
		for a.st.StickyStore().Health().Healthy {
			if time.Since(start) > downAfter+5*time.Second {
				t.Fatalf("%s: never marked down after %d picks", mode, picks)
			}
			t0 := time.Now()
			if _, d := a.pick(t, pool, fmt.Sprint(mode, "-first-", picks), "app"); d.Sticky {
				t.Fatalf("%s: %+v", mode, d)
			}
			if el := time.Since(t0); el > 3*timeout {
				t.Fatalf("%s: a pick took %v, over 3× the %v timeout", mode, el, timeout)
			}
			picks++
			if mode == "down" {
				time.Sleep(10 * ms) // failing fast: let DownAfter pass
			}
		}
		if el := time.Since(start); el < downAfter || picks < 2 {
			t.Fatalf("%s: marked down after %v and %d picks, on less evidence than %v and 3 calls", mode, el, picks, downAfter)
		}
		h := a.st.StickyStore().Health()
		if h.Healthy || h.LastError == "" || h.DownSince.IsZero() || h.LastReason == "" {
			t.Fatalf("%s: health %+v", mode, h)
		}
		calls := store.Calls()
		for i := range 100 {
			u, _ := a.pick(t, pool, fmt.Sprint(mode, i), "app") // local picks, pinned locally
			if again, d := a.pick(t, pool, fmt.Sprint(mode, i), "app"); again != u || !d.Sticky {
				t.Fatalf("%s: local pin lost", mode)
			}
		}
		// The recheck loop may ping meanwhile; requests add nothing.
		if extra := store.Calls() - calls; extra > 20 {
			t.Fatalf("%s: %d store calls for 200 requests while known down", mode, extra)
		}
		if a.st.StickyStoreStats().Skipped.Load() == 0 || a.st.StickyStoreStats().Pending() < 100 {
			t.Fatalf("%s: skipped %d, pending %d", mode, a.st.StickyStoreStats().Skipped.Load(), a.st.StickyStoreStats().Pending())
		}
		store.SetDown(false)
		store.SetHang(false)
		deadline := time.Now().Add(10 * time.Second)
		for !a.st.StickyStore().Health().Healthy {
			if time.Now().After(deadline) {
				t.Fatalf("%s: store never marked healthy again", mode)
			}
			time.Sleep(5 * ms)
		}
		user := mode + "-after"
		first, _ := a.pick(t, pool, user, "app")
		if u, d := b.pick(t, pool, user, "app"); u != first || !d.FromStore {
			t.Fatalf("%s: a new pair is not shared after the store came back: %s %+v", mode, u.addr, d)
		}
		// The pins made while it was down: a hit writes them back.
		for i := range 100 {
			want, _ := a.pick(t, pool, fmt.Sprint(mode, i), "app")
			waitInflight(a)
			if u, _ := b.pick(t, pool, fmt.Sprint(mode, i), "app"); u != want {
				t.Fatalf("%s: pair %d made while down: %s on b, %s on a", mode, i, u.addr, want.addr)
			}
		}
	}
	if a.st.StickyStoreStats().Errors.Load() < 2 {
		t.Fatalf("errors %d", a.st.StickyStoreStats().Errors.Load())
	}
}

func waitInflight(r *replica) {
	for r.st.StickyStore().inflight.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
}

// slowStore answers every call, each one slow past the timeout.
type slowStore struct {
	*MemStore
	slow atomic.Int32 // calls left to answer late
}

func (s *slowStore) late(ctx context.Context) error {
	if s.slow.Add(-1) >= 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (s *slowStore) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := s.late(ctx); err != nil {
		return "", err
	}
	return s.MemStore.Get(ctx, key, ttl)
}

func (s *slowStore) SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	if err := s.late(ctx); err != nil {
		return false, err
	}
	return s.MemStore.SetNX(ctx, key, value, ttl)
}

// One slow answer (or a few at once, a stalled host) is not a down store:
// the store stays healthy, the request that met it goes on, and its pair,
// picked here without the store's word, follows the pin another replica
// made once a hit reconciles it: one switch, then never again. A pick
// without the store's word is the pair's rendezvous choice, the one
// another replica with the same view makes.
func TestStickyStoreSlowAnswerIsNotDown(t *testing.T) {
	mem := NewMemStore()
	pool := pubs(3)
	store := &slowStore{MemStore: mem}
	a, b := newReplica(t, mem, pool, 5*ms, 6*ms, 7*ms), newReplica(t, store, pool, 5*ms, 6*ms, 7*ms)
	b.st.StickyStore().cfg.DownAfter = time.Hour // however many at once: no run of failures lasts that long
	b.st.StickyStore().cfg.Timeout = 10 * ms
	key := func(u string) string { return StickyStoreKey("edgesteer:latency_bucket:apps", u, "app") }
	switched := 0
	for i := range 60 {
		user := fmt.Sprint("u", i)
		// Another replica's pin (picked while its bucket view differed
		// from b's, so b's own pick may differ).
		want := pool[i%3]
		mem.Put(key(user), want.addr)
		store.slow.Store(2) // b's read and its write both time out
		first, _ := b.pick(t, pool, user, "app")
		if !b.st.StickyStore().Health().Healthy {
			t.Fatal("two slow answers marked the store down")
		}
		if first != want {
			switched++
		}
		var seq []string
		for range 4 {
			u, _ := b.pick(t, pool, user, "app")
			waitInflight(b)
			seq = append(seq, u.addr)
		}
		// The hit after the first reconciles; from the next one on the
		// pair is on the store's pin, for good.
		for _, p := range seq[1:] {
			if p != want.addr {
				t.Fatalf("%s on b after reconciliation: %v, the store has %s", user, seq, want.addr)
			}
		}
		if v, _ := mem.Value(key(user)); v != want.addr {
			t.Fatalf("%s: the store's pin changed to %q", user, v)
		}
	}
	st := b.st.StickyStoreStats()
	if switched == 0 || st.ReconcileAdopted.Load() != uint64(switched) || st.Pending() != 0 {
		t.Fatalf("switched %d, adopted %d, pending %d", switched, st.ReconcileAdopted.Load(), st.Pending())
	}
	// Pins of b alone (no other replica's pin) are written, not changed.
	for i := range 20 {
		user := fmt.Sprint("only-b-", i)
		store.slow.Store(2)
		first, _ := b.pick(t, pool, user, "app")
		b.pick(t, pool, user, "app")
		waitInflight(b)
		if v, _ := mem.Value(key(user)); v != first.addr {
			t.Fatalf("%s: local pin %s written back as %q", user, first.addr, v)
		}
		if u, _ := a.pick(t, pool, user, "app"); u != first {
			t.Fatalf("%s: a follows %s, b pinned %s", user, u.addr, first.addr)
		}
	}
	// Both replicas' own picks, each made without the store's word, agree;
	// the pairs still spread over the bucket.
	used := map[*up]int{}
	defer func() {
		if len(used) != 3 {
			t.Fatalf("50 pairs over %d of 3 publishers", len(used))
		}
	}()
	for i := range 50 {
		user := fmt.Sprint("blind-", i)
		store.slow.Store(2)
		ub, _ := b.pick(t, pool, user, "app")
		mem.SetDown(true)
		ua, _ := a.pick(t, pool, user, "app")
		mem.SetDown(false)
		if ua != ub {
			t.Fatalf("%s: picked %s on a and %s on b, both without the store", user, ua.addr, ub.addr)
		}
		used[ua]++
	}
}

// Failures racing each other and a recheck's success: every transition is
// reported once, down and back alternate, and the health the last report
// gave is the health in force (a failure is never lost behind a success).
func TestStickyStoreHealthTransitionsRace(t *testing.T) {
	testHookFailDecided = func() { time.Sleep(200 * time.Microsecond) }
	defer func() { testHookFailDecided = nil }()
	for round := range 10 {
		store := NewMemStore()
		var mu sync.Mutex
		var events []bool
		cfg := StickyStoreConfig{Store: store, Recheck: time.Millisecond, DownAfter: time.Nanosecond, DownFailures: 1,
			OnHealth: func(healthy bool, err error) { mu.Lock(); events = append(events, healthy); mu.Unlock() }}
		s := newStickyStore(cfg, &StickyStoreStats{}, time.Hour)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 200 {
					s.fail("k", ErrMemDown)
					if (g+i)%50 == 0 {
						time.Sleep(time.Millisecond) // let rechecks succeed in between
					}
				}
			}()
		}
		wg.Wait()
		// The store answers pings all along: the last recheck brings it back.
		deadline := time.Now().Add(5 * time.Second)
		for !s.healthy.Load() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond)
		s.close()
		mu.Lock()
		for i, h := range events {
			if h != (i%2 == 1) {
				t.Fatalf("round %d: transitions %v: not down, back, down… (a doubled report)", round, events)
			}
		}
		if len(events) == 0 || !events[len(events)-1] || !s.healthy.Load() {
			t.Fatalf("round %d: transitions %v, healthy %v", round, events, s.healthy.Load())
		}
		mu.Unlock()
	}
}

// racingStore pins the pair for another publisher between a replica's
// lookup and its write, as another replica picking in the same instant.
type racingStore struct {
	*MemStore
	once  sync.Once
	other string
}

func (r *racingStore) SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	r.once.Do(func() { r.MemStore.Put(key, r.other) })
	return r.MemStore.SetNX(ctx, key, value, ttl)
}

// Of two replicas picking one new pair at once, the first write wins and
// the other adopts it.
func TestStickyStoreConcurrentFirstPickAdopts(t *testing.T) {
	pool := pubs(2)
	for _, other := range []string{"publisher1:443", "publisher2:443"} {
		store := &racingStore{MemStore: NewMemStore(), other: other}
		r := newReplica(t, store, pool, 5*ms, 6*ms)
		u, d := r.pick(t, pool, "u", "app")
		if u.addr != other || d.Sticky {
			t.Fatalf("picked %s %+v, the other replica's pin is %s", u.addr, d, other)
		}
		if again, _ := r.pick(t, pool, "u", "app"); again.addr != other {
			t.Fatalf("local pin %s, want %s", again.addr, other)
		}
	}
}

// While no publisher is measured (cold start) the shared level is not
// read: no pin is made, so no store call is due.
func TestStickyStoreColdStartNoCalls(t *testing.T) {
	store := NewMemStore()
	pool := pubs(3)
	r := newReplica(t, store, pool)
	for i := range 20 {
		r.pick(t, pool, fmt.Sprint("u", i), "app")
	}
	if store.Calls() != 0 {
		t.Fatalf("%d store calls at cold start", store.Calls())
	}
}

func TestStickyStoreKey(t *testing.T) {
	for _, c := range []struct{ user, app, want string }{
		{"alice", "app.example", "p:alice:app.example"},
		{"a:b", "c", "p:a%3Ab:c"},
		{"a", "b:c", "p:a:b%3Ac"},
		{"x y%{z}", "\x00é", "p:x%20y%25%7Bz%7D:%00%C3%A9"},
	} {
		if got := StickyStoreKey("p", c.user, c.app); got != c.want {
			t.Errorf("StickyStoreKey(%q, %q) = %q, want %q", c.user, c.app, got, c.want)
		}
	}
	long := StickyStoreKey("p", strings.Repeat("u", 5000), "app")
	if len(long) != len("p:sha256:")+64 || !strings.HasPrefix(long, "p:sha256:") {
		t.Fatalf("long key %q", long)
	}
	if long == StickyStoreKey("p", strings.Repeat("u", 5001), "app") {
		t.Fatal("two long pairs share a key")
	}
}

// A reload that keeps the store keeps the StickyStore (and its health); one
// that drops it, or turns sticky off, removes it.
func TestStickyStoreSettingsApply(t *testing.T) {
	store := NewMemStore()
	s := settings(32 * ms)
	s.StickyStore = &StickyStoreConfig{Store: store, Prefix: "p"}
	st, err := NewState(s)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	first := st.StickyStore()
	if first == nil {
		t.Fatal("no shared level")
	}
	s2 := s
	s2.StickyStore = &StickyStoreConfig{Store: store, Prefix: "p", Timeout: DefaultStickyStoreTimeout}
	s2.StickyTTL = 2 * time.Hour
	if _, err := st.Lease("gen2", s2); err != nil {
		t.Fatal(err)
	}
	if st.StickyStore() != first || time.Duration(first.ttl.Load()) != 2*time.Hour {
		t.Fatal("an unchanged store was replaced, or the TTL not applied")
	}
	s3 := s
	s3.StickyStore = nil
	if _, err := st.Lease("gen3", s3); err != nil || st.StickyStore() != nil {
		t.Fatalf("store dropped: %v %v", err, st.StickyStore())
	}
	s4 := s
	s4.Sticky = false
	if _, err := st.Lease("gen4", s4); err != nil || st.StickyStore() != nil {
		t.Fatalf("sticky off: %v %v", err, st.StickyStore())
	}
}

// A pair in use only from a replica's local table renews its store entry
// once per half TTL, off the request's path: hours later another replica
// still finds it, and an entry lost by a Redis restarted empty comes back.
func TestStickyStoreRefreshKeepsPairsInUse(t *testing.T) {
	store := NewMemStore()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	store.SetNow(func() time.Time { return time.Unix(0, clock.Load()) })
	pool := pubs(3)
	a := newReplica(t, store, pool, 5*ms, 6*ms, 7*ms) // sticky_ttl 1h
	pick := func(r *replica) (*up, Decision) {
		u, d, ok := r.sel.Select(pool, "alice", "app", clock.Load())
		if !ok {
			t.Fatal("no pick")
		}
		for r.st.StickyStore().inflight.Load() != 0 {
			time.Sleep(time.Millisecond)
		}
		return u, d
	}
	first, _ := pick(a)
	key := StickyStoreKey("edgesteer:latency_bucket:apps", "alice", "app")
	for range 9 { // 3 hours, a request every 20 minutes, all local hits
		clock.Add(int64(20 * time.Minute))
		if u, d := pick(a); u != first || !d.Sticky || d.FromStore {
			t.Fatalf("local hit: %s %+v", u.addr, d)
		}
		if v, ok := store.Value(key); !ok || v != first.addr {
			t.Fatalf("store entry after %v: %q %v", time.Unix(0, clock.Load()), v, ok)
		}
	}
	if n := a.st.StickyStoreStats().Refreshes.Load(); n < 5 || n > 7 {
		t.Fatalf("%d renewals in 3 hours at a TTL of 1h, want one per half hour", n)
	}
	b := newReplica(t, store, pool, 5*ms, 6*ms, 7*ms)
	if u, d := pick(b); u != first || !d.FromStore {
		t.Fatalf("another replica 3 hours later: %s %+v, want %s from the store", u.addr, d, first.addr)
	}
	store.Flush()
	clock.Add(int64(40 * time.Minute))
	pick(a)
	if v, ok := store.Value(key); !ok || v != first.addr {
		t.Fatalf("entry not restored after a flush: %q %v", v, ok)
	}
}
