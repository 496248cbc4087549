package diameteragent

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameter"
)

// replicas are two agents sharing one store, each with its own servers
// of the same names (as two replicas see the same PCRFs).
func replicas(t *testing.T, ttl time.Duration) (a, b *harness, st *diambind.MemStore) {
	st = diambind.NewMemStore()
	cfg := baseConfig()
	cfg.BindingTTL = ttl
	cfg.BindingStore = &diambind.Config{Store: st, Name: "mem", Prefix: "es:diameter_agent:dra",
		DownFailures: 2, DownAfter: time.Millisecond, Recheck: 5 * time.Millisecond}
	a, b = newHarness(t, cfg), newHarness(t, cfg)
	a.start()
	b.start()
	return a, b, st
}

func storeView(h *harness) diambind.View { return *h.agent.View().BindingStore }

// A session opened through one replica and continued through the other
// stays on its server: the other reads the store once, on its local miss,
// and not again; a CCR-I is never looked up; a CCR-T through the other
// replica deletes the store's binding.
func TestSharedBindingAcrossReplicas(t *testing.T) {
	a, b, st := replicas(t, time.Hour)
	ca, cb := a.connect("pgw1.example"), b.connect("pgw1.example")
	sessions := []string{"s1", "s2", "s3", "s4"}
	first := map[string]string{}
	for i, s := range sessions {
		first[s] = ca.call(req{app: diameter.AppGx, ccType: 1, session: s, e2e: uint32(i + 1)}.bytes(t)).origin
	}
	eventually(t, "the bindings in the store", func() bool { return st.Len() == len(sessions) })
	// B's round robin is shifted by one: without the store, each CCR-U
	// would go to the other PCRF.
	cb.call(req{app: diameter.AppGx, ccType: 1, session: "b-only", e2e: 50}.bytes(t))
	if st.Gets() != 0 {
		t.Fatalf("a CCR-I read the store (%d reads)", st.Gets())
	}
	for round := range 2 {
		for i, s := range sessions {
			if got := cb.call(req{app: diameter.AppGx, ccType: 2, session: s, e2e: uint32(100*round + i)}.bytes(t)).origin; got != first[s] {
				t.Fatalf("session %s CCR-U through B went to %s, its CCR-I through A to %s", s, got, first[s])
			}
		}
	}
	if n := st.Gets(); n != len(sessions) {
		t.Fatalf("%d store reads for %d sessions continued twice: a local hit must not read the store", n, len(sessions))
	}
	if got := cb.call(req{app: diameter.AppGx, ccType: 3, session: "s1", e2e: 900}.bytes(t)).origin; got != first["s1"] {
		t.Fatalf("CCR-T went to %s", got)
	}
	key := diambind.Key("es:diameter_agent:dra", []byte("s1"))
	eventually(t, "the ended binding deleted", func() bool { _, ok := st.Value(key); return !ok })
	if c := storeView(b).Counts; c.Found != int64(len(sessions)) || c.Ended != 1 {
		t.Fatalf("B's counts %+v", c)
	}
}

// With the store down, bindings stay local (sessions keep their server)
// and that is counted and shown; what was bound meanwhile is written when
// the store answers again, and the other replica then continues those
// sessions on their servers.
func TestSharedBindingStoreDownReconciles(t *testing.T) {
	a, b, st := replicas(t, time.Hour)
	ca, cb := a.connect("pgw1.example"), b.connect("pgw1.example")
	st.SetDown(true)
	// Local misses of continuing requests give the evidence of a down store.
	for i := 0; storeView(a).Healthy; i++ {
		ca.call(req{app: diameter.AppGx, ccType: 2, session: fmt.Sprint("probe", i), e2e: uint32(1000 + i)}.bytes(t))
		time.Sleep(2 * time.Millisecond)
	}
	first := map[string]string{}
	for i := range 6 {
		s := fmt.Sprint("outage", i)
		first[s] = ca.call(req{app: diameter.AppGx, ccType: 1, session: s, e2e: uint32(i + 1)}.bytes(t)).origin
		if got := ca.call(req{app: diameter.AppGx, ccType: 2, session: s, e2e: uint32(i + 100)}.bytes(t)).origin; got != first[s] {
			t.Fatalf("with the store down, session %s moved from %s to %s", s, first[s], got)
		}
	}
	v := storeView(a)
	if v.Healthy || v.Counts.Downs != 1 || v.Queued < 6 || v.DownSince.IsZero() || v.LastReason != "refused" {
		t.Fatalf("A's view while the store is down: %+v", v)
	}
	cb.call(req{app: diameter.AppGx, ccType: 1, session: "b-only", e2e: 50}.bytes(t)) // shift B's round robin
	st.SetDown(false)
	eventually(t, "A's queue written", func() bool { v := storeView(a); return v.Healthy && v.Queued == 0 })
	if c := storeView(a).Counts; c.Reconciled < 6 {
		t.Fatalf("reconciled %d, want at least the 6 sessions", c.Reconciled)
	}
	for i := range 6 {
		s := fmt.Sprint("outage", i)
		if got := cb.call(req{app: diameter.AppGx, ccType: 2, session: s, e2e: uint32(i + 200)}.bytes(t)).origin; got != first[s] {
			t.Fatalf("session %s bound during the outage went through B to %s, not %s", s, got, first[s])
		}
	}
}

// A binding in use only through one replica is renewed in the store once
// an epoch (TTL/2) turns, off the request's path: no store read.
func TestSharedBindingRenewedWithoutRead(t *testing.T) {
	a, _, st := replicas(t, time.Minute)
	ca := a.connect("pgw1.example")
	ca.call(req{app: diameter.AppGx, ccType: 1, session: "long", e2e: 1}.bytes(t))
	eventually(t, "the write", func() bool { return storeView(a).Counts.Written == 1 })
	ca.call(req{app: diameter.AppGx, ccType: 2, session: "long", e2e: 2}.bytes(t))
	a.clock.Advance(31 * time.Second)
	ca.call(req{app: diameter.AppGx, ccType: 2, session: "long", e2e: 3}.bytes(t))
	ca.call(req{app: diameter.AppGx, ccType: 2, session: "long", e2e: 4}.bytes(t))
	eventually(t, "the renewal", func() bool { return storeView(a).Counts.Written == 2 })
	if st.Gets() != 0 {
		t.Fatalf("%d store reads for a session bound locally", st.Gets())
	}
}

// Two replicas that bound one session to different servers (the store
// was unreachable to one): the first write wins and the other replica's
// session follows it from its next request.
func TestSharedBindingConflictAdopted(t *testing.T) {
	a, _, st := replicas(t, time.Hour)
	ca := a.connect("pgw1.example")
	key := diambind.Key("es:diameter_agent:dra", []byte("both"))
	st.SetDown(true)
	for i := 0; storeView(a).Healthy; i++ {
		ca.call(req{app: diameter.AppGx, ccType: 2, session: fmt.Sprint("probe", i), e2e: uint32(1000 + i)}.bytes(t))
		time.Sleep(2 * time.Millisecond)
	}
	mine := ca.call(req{app: diameter.AppGx, ccType: 1, session: "both", e2e: 1}.bytes(t)).origin
	other := "pcrf1.example"
	if mine == other {
		other = "pcrf2.example"
	}
	st.Put(key, other) // the other replica's write came first
	st.SetDown(false)
	eventually(t, "the adoption", func() bool { return storeView(a).Counts.Adopted == 1 })
	if got := ca.call(req{app: diameter.AppGx, ccType: 2, session: "both", e2e: 2}.bytes(t)).origin; got != other {
		t.Fatalf("after the reconciliation the session went to %s, the store's binding is %s", got, other)
	}
}

// A session whose server fails moves with its re-sent request, and the
// move overwrites the store's binding, so the other replica follows it.
func TestSharedBindingFollowsFailover(t *testing.T) {
	a, b, st := replicas(t, time.Hour)
	ca, cb := a.connect("pgw1.example"), b.connect("pgw1.example")
	first := ca.call(req{app: diameter.AppGx, ccType: 1, session: "moving", e2e: 1}.bytes(t)).origin
	key := diambind.Key("es:diameter_agent:dra", []byte("moving"))
	eventually(t, "the write", func() bool { v, _ := st.Value(key); return v == first })
	other := "pcrf1.example"
	if first == other {
		other = "pcrf2.example"
	}
	srv := a.srv[first]
	srv.setHold(true)
	ca.send(req{app: diameter.AppGx, ccType: 2, session: "moving", e2e: 2}.bytes(t))
	eventually(t, "the request held", func() bool { return len(srv.requests()) == 2 })
	srv.conn.Close() // its connection fails: the request is re-sent to the other
	if got := ca.next(); got.origin != other {
		t.Fatalf("re-sent request answered by %s, want %s", got.origin, other)
	}
	eventually(t, "the move in the store", func() bool { v, _ := st.Value(key); return v == other })
	if got := cb.call(req{app: diameter.AppGx, ccType: 2, session: "moving", e2e: 3}.bytes(t)).origin; got != other {
		t.Fatalf("the other replica sent the moved session to %s, want %s", got, other)
	}
}

// A reload keeps the shared level (its queue and counts) while the store
// is configured, and closes it when the configuration drops it.
func TestSharedBindingAcrossReloads(t *testing.T) {
	a, _, _ := replicas(t, time.Hour)
	ca := a.connect("pgw1.example")
	ca.call(req{app: diameter.AppGx, ccType: 1, session: "kept", e2e: 1}.bytes(t))
	eventually(t, "the write", func() bool { return storeView(a).Counts.Written == 1 })
	cfg := a.agent.gen.Load().cfg
	cfg.BindingStore = &diambind.Config{Store: cfg.BindingStore.Store, Name: "mem2", Prefix: cfg.BindingStore.Prefix}
	if err := a.agent.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if v := storeView(a); v.Store != "mem2" || v.Counts.Written != 1 {
		t.Fatalf("after a reload changing the store's name: %+v", v)
	}
	cfg.BindingStore = nil
	if err := a.agent.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if v := a.agent.View().BindingStore; v != nil {
		t.Fatalf("a binding store after a reload without one: %+v", v)
	}
	if got := ca.call(req{app: diameter.AppGx, ccType: 2, session: "kept", e2e: 2}.bytes(t)); got.result != ResultSuccess {
		t.Fatalf("after the store was dropped: %+v", got)
	}
}
