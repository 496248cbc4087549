package pubsel

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

// closeStore is a MemStore that refuses the keys of user "refused" (an
// error reply: the store answered), gets no answer for user "down" and for
// every ping (as a store gone away), and hangs on user "hang" until a
// little after the call's context ends.
type closeStore struct{ *MemStore }

func (s closeStore) trouble(ctx context.Context, key string) error {
	switch {
	case strings.Contains(key, ":refused:"):
		return &StoreError{Reason: "noperm", Answered: true, Err: ErrMemDown}
	case strings.Contains(key, ":down:"):
		return &StoreError{Reason: "refused", Err: ErrMemDown}
	case strings.Contains(key, ":hang"):
		<-ctx.Done()
		// A client takes a moment to give up a call (go-redis closes the
		// connection): a close that cancelled without waiting returns
		// while this runs.
		time.Sleep(100 * time.Millisecond)
		return ctx.Err()
	}
	return nil
}

func (s closeStore) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := s.trouble(ctx, key); err != nil {
		return "", err
	}
	return s.MemStore.Get(ctx, key, ttl)
}

func (s closeStore) SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	if err := s.trouble(ctx, key); err != nil {
		return false, err
	}
	return s.MemStore.SetNX(ctx, key, value, ttl)
}

func (s closeStore) Ping(context.Context) error {
	return &StoreError{Reason: "refused", Err: ErrMemDown}
}

// storeGoroutines counts the goroutines running the shared level's
// background work (a renewal or reconciliation, the recheck loop, the
// refusal watcher, or a call of closeStore), from every goroutine's stack:
// a goroutine that has finished its work and is only returning is not
// counted, so the count after close is exact, not a matter of timing.
func storeGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range []string{"(*StickyStore).recheck(", "(*StickyStore).watchRefusal(",
			"(*StickyStore).inBackground.func", "pubsel.closeStore."} {
			if strings.Contains(g, fn) {
				count++
				break
			}
		}
	}
	return count
}

// The goroutines of the shared level end by the time the State's Close
// returns (the last config generation's Cleanup), and when a reload
// replaces the store: the recheck loop of a store marked down, the watcher
// of one refusing keys, and background renewals waiting on a store that
// does not answer (every wait a minute long here). None starts after.
func TestStickyStoreGoroutinesEndByClose(t *testing.T) {
	for _, how := range []string{"close", "reload"} {
		t.Run(how, func(t *testing.T) {
			s := settings(32 * ms)
			s.StickyStore = &StickyStoreConfig{Store: closeStore{NewMemStore()}, Prefix: "p", Timeout: time.Minute,
				Recheck: time.Minute, RefusalHold: time.Minute, DownFailures: 1, DownAfter: time.Nanosecond}
			st, err := NewState(s)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			lease, err := st.Lease(t, s)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release()
			ss := st.StickyStore()
			before := storeGoroutines()

			const hanging = 3
			for i := range hanging {
				ss.refresh("hang", string(rune('a'+i)), "publisher1:443")
			}
			ss.claim(ss.Key("refused", "app"), "publisher1:443", false) // the watcher starts
			for ss.Health().Healthy {                                   // the second call marks it down: the recheck loop starts
				ss.lookup(ss.Key("down", "app"))
			}
			if h := ss.Health(); h.Healthy || !h.Refusing {
				t.Fatalf("the store should be down and refusing: %+v", h)
			}
			want := before + hanging + 2
			for deadline := time.Now().Add(10 * time.Second); storeGoroutines() != want; {
				if time.Now().After(deadline) {
					t.Fatalf("%d goroutines of the store, want %d", storeGoroutines(), want)
				}
				time.Sleep(time.Millisecond)
			}

			switch how {
			case "close":
				st.Close()
			case "reload":
				next := s
				next.StickyStore = &StickyStoreConfig{Store: NewMemStore(), Prefix: "other"}
				l2, err := st.Lease(t.Name()+"/next", next)
				if err != nil {
					t.Fatal(err)
				}
				defer l2.Release()
				if st.StickyStore() == ss {
					t.Fatal("the reload kept the old store")
				}
			}
			if n := storeGoroutines(); n != before {
				t.Fatalf("%s returned with %d goroutines of the store still running (%d before it started any)", how, n, before)
			}
			skipped := st.StickyStoreStats().Skipped.Load()
			ss.refresh("hang", "after", "publisher1:443")
			if n := storeGoroutines(); n != before || st.StickyStoreStats().Skipped.Load() != skipped+1 {
				t.Fatalf("a renewal after %s: %d goroutines of the store, skipped %d→%d", how, n, skipped,
					st.StickyStoreStats().Skipped.Load())
			}
		})
	}
}
