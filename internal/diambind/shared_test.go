package diambind

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// testConfig marks the store down after 2 calls without an answer 1 ms
// apart and pings it every 5 ms, so tests see transitions at once.
func testConfig(st Store) Config {
	return Config{Store: st, Name: "mem", Prefix: "es:diameter_agent:dra", DownFailures: 2,
		DownAfter: time.Millisecond, Recheck: 5 * time.Millisecond}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type adoptions struct {
	mu   sync.Mutex
	got  map[string]string
	deny bool
}

func (a *adoptions) adopt(sid, server string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deny {
		return false
	}
	if a.got == nil {
		a.got = map[string]string{}
	}
	a.got[sid] = server
	return true
}

func TestKeyEscapesAndBounds(t *testing.T) {
	for _, c := range []struct{ sid, want string }{
		{"pgw1.example;1;2", "p:pgw1.example;1;2"},
		{"a b%{c}\x00é", "p:a%20b%25%7Bc%7D%00%C3%A9"},
	} {
		if got := Key("p", []byte(c.sid)); got != c.want {
			t.Errorf("Key(%q) = %q, want %q", c.sid, got, c.want)
		}
	}
	long := Key("p", []byte(strings.Repeat("x", 201)))
	if !strings.HasPrefix(long, "p:sha256:") || len(long) != len("p:sha256:")+64 {
		t.Errorf("a 201-byte Session-Id's key is %q", long)
	}
	if Key("p", []byte(strings.Repeat("x", 200))) != "p:"+strings.Repeat("x", 200) {
		t.Error("a 200-byte Session-Id is hashed")
	}
}

// A binding made here is written (SET NX); a lookup finds it; an end
// deletes it; a newer decision for a session replaces a queued one.
func TestWriteThroughLookupEnd(t *testing.T) {
	st := NewMemStore()
	s := New(testConfig(st), time.Hour, nil, nil)
	defer s.Close()
	s.Claim([]byte("s1"), "pcrf1.example")
	key := Key("es:diameter_agent:dra", []byte("s1"))
	eventually(t, "the write", func() bool { v, _ := st.Value(key); return v == "pcrf1.example" })
	if got, ok := s.Lookup([]byte("s1")); !ok || got != "pcrf1.example" {
		t.Fatalf("lookup %q %v", got, ok)
	}
	if _, ok := s.Lookup([]byte("other")); ok {
		t.Fatal("found a session never bound")
	}
	s.Move([]byte("s1"), "pcrf2.example")
	eventually(t, "the move", func() bool { v, _ := st.Value(key); return v == "pcrf2.example" })
	s.End([]byte("s1"))
	eventually(t, "the delete", func() bool { _, ok := st.Value(key); return !ok })
	c := s.View().Counts
	if c.Lookups != 2 || c.Found != 1 || c.NotFound != 1 || c.Written != 2 || c.Ended != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// A value that cannot be a server identity is not taken.
func TestLookupRejectsMalformedValue(t *testing.T) {
	st := NewMemStore()
	s := New(testConfig(st), time.Hour, nil, nil)
	defer s.Close()
	st.Put(Key("es:diameter_agent:dra", []byte("s")), "has space")
	if v, ok := s.Lookup([]byte("s")); ok {
		t.Fatalf("took %q", v)
	}
	if s.View().Counts.Malformed != 1 {
		t.Fatal("not counted")
	}
}

// A store that does not answer: after the evidence it is down (once,
// counted), lookups skip it, bindings made and ended meanwhile are queued
// (bounded) and written when it answers again, counted as reconciled.
func TestDownQueuesAndReconciles(t *testing.T) {
	st := NewMemStore()
	cfg := testConfig(st)
	cfg.Backlog = 3
	s := New(cfg, time.Hour, nil, nil)
	defer s.Close()
	st.Put(Key(cfg.Prefix, []byte("ended")), "pcrf1.example")
	st.SetDown(true)
	for s.View().Counts.Downs == 0 {
		s.Lookup([]byte("x"))
		time.Sleep(time.Millisecond)
	}
	if s.Healthy() {
		t.Fatal("healthy after the evidence")
	}
	gets := st.Gets()
	if _, ok := s.Lookup([]byte("x")); ok || st.Gets() != gets || s.View().Counts.Skipped != 1 {
		t.Fatalf("a lookup while down asked the store (%d → %d) or was not counted", gets, st.Gets())
	}
	s.Claim([]byte("a"), "pcrf1.example")
	s.Claim([]byte("b"), "pcrf2.example")
	s.End([]byte("ended"))
	s.Claim([]byte("over"), "pcrf1.example") // the backlog is 3
	v := s.View()
	if v.Queued != 3 || v.Counts.Dropped != 1 || v.Counts.Downs != 1 {
		t.Fatalf("view while down %+v", v)
	}
	st.SetDown(false)
	eventually(t, "the reconciliation", func() bool { return s.Healthy() && s.View().Queued == 0 })
	for sid, want := range map[string]string{"a": "pcrf1.example", "b": "pcrf2.example"} {
		if got, _ := st.Value(Key(cfg.Prefix, []byte(sid))); got != want {
			t.Errorf("%s: store has %q, want %q", sid, got, want)
		}
	}
	if _, ok := st.Value(Key(cfg.Prefix, []byte("ended"))); ok {
		t.Error("the session ended while the store was down is still there")
	}
	if c := s.View().Counts; c.Reconciled != 3 || c.Downs != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// One call without an answer is not a down store.
func TestOneFailureIsNotDown(t *testing.T) {
	st := NewMemStore()
	cfg := testConfig(st)
	cfg.DownFailures = 3
	s := New(cfg, time.Hour, nil, nil)
	defer s.Close()
	st.SetDown(true)
	s.Lookup([]byte("x"))
	s.Lookup([]byte("x"))
	st.SetDown(false)
	s.Lookup([]byte("x"))
	st.SetDown(true)
	s.Lookup([]byte("x"))
	s.Lookup([]byte("x"))
	if !s.Healthy() {
		t.Fatal("down without three calls in a row unanswered")
	}
}

// Two replicas bound one session during an outage: the first write wins,
// the other adopts it; a replica that cannot adopt it overwrites it.
func TestClaimConflictFirstWriterWins(t *testing.T) {
	st := NewMemStore()
	cfg := testConfig(st)
	var ad adoptions
	s := New(cfg, time.Hour, nil, ad.adopt)
	defer s.Close()
	key := Key(cfg.Prefix, []byte("s"))
	st.Put(key, "pcrf2.example") // the other replica's
	s.Claim([]byte("s"), "pcrf1.example")
	eventually(t, "the adoption", func() bool { return s.View().Counts.Adopted == 1 })
	if v, _ := st.Value(key); v != "pcrf2.example" || ad.got["s"] != "pcrf2.example" {
		t.Fatalf("store %q, adopted %v", v, ad.got)
	}
	ad.mu.Lock()
	ad.deny = true
	ad.mu.Unlock()
	st.Put(key, "gone.example")
	s.Claim([]byte("s"), "pcrf1.example")
	eventually(t, "the overwrite", func() bool { v, _ := st.Value(key); return v == "pcrf1.example" })
}

// Renewal epochs turn every TTL/2.
func TestEpoch(t *testing.T) {
	s := New(testConfig(NewMemStore()), time.Hour, nil, nil)
	defer s.Close()
	t0 := time.Unix(1_800_000_000, 0)
	e := s.Epoch(t0)
	if s.Epoch(t0.Add(30*time.Minute)) == e {
		t.Fatal("the epoch did not turn after TTL/2")
	}
}

// A store that accepts calls and never answers: each lookup gives up at
// the timeout (a context deadline, reason "timeout"); after the evidence
// the store is down and lookups no longer ask it, so no request waits;
// it is back once a ping is answered.
func TestHangingStoreIsMarkedDown(t *testing.T) {
	st := NewMemStore()
	cfg := testConfig(st)
	cfg.Timeout = 5 * time.Millisecond
	s := New(cfg, time.Hour, nil, nil)
	defer s.Close()
	st.SetHang(true)
	for s.Healthy() {
		if _, ok := s.Lookup([]byte("x")); ok {
			t.Fatal("a hanging store answered")
		}
	}
	if v := s.View(); v.LastReason != "timeout" || v.Counts.Downs != 1 {
		t.Fatalf("view %+v", v)
	}
	gets := st.Gets()
	for range 10 {
		s.Lookup([]byte("x"))
	}
	if st.Gets() != gets || s.View().Counts.Skipped != 10 {
		t.Fatalf("lookups while down asked the store: %d → %d reads", gets, st.Gets())
	}
	s.Claim([]byte("x"), "pcrf1.example")
	st.SetHang(false)
	eventually(t, "back and written", func() bool { v, _ := st.Value(Key(cfg.Prefix, []byte("x"))); return s.Healthy() && v != "" })
}
