package quota

import (
	"context"
	"errors"
	"testing"
	"time"
)

// cutOff is a replica's link to the store that fails every sync (a link
// slower than the sync's deadline), while its heartbeat connection
// (KeepAlive's store) goes through.
type cutOff struct{ Store }

func (cutOff) Sync(context.Context, *Batch) (*Answer, error) {
	return nil, errors.New("i/o timeout")
}

// A replica whose syncs fail stays, to the others, live at its fallback
// share past ReplicaTTL while its heartbeat written alone lands
// (KeepAlive), and is forgotten after ReplicaTTL without it.
func TestKeepAlive(t *testing.T) {
	for _, keep := range []bool{true, false} {
		now := t0
		store := NewFakeStore()
		store.Now = func() time.Time { return now }
		clock := func() time.Time { return now }
		cfg := Config{Prefix: "p", Limit: 300, ReplicaTTL: time.Second}
		cfg.Replica = "a"
		a, _ := NewWithClock(cfg, store, clock)
		cfg.Replica = "b"
		b, _ := NewWithClock(cfg, store, clock)
		sync := func(q *Quota, s Store) {
			q.SetStore(s)
			_ = q.Sync(context.Background(), now)
		}
		for range 4 { // both registered
			sync(a, store)
			sync(b, store)
			now = now.Add(250 * time.Millisecond)
		}
		if a.KeepAliveNeeded() {
			t.Fatalf("a healthy replica wants its heartbeat alone")
		}
		for range 12 { // 3 s of a's syncs failing
			sync(a, cutOff{store})
			if keep {
				if sent, err := a.KeepAlive(context.Background(), store, now); !sent || err != nil {
					t.Fatalf("KeepAlive: sent %v, %v", sent, err)
				}
			}
			now = now.Add(250 * time.Millisecond)
			sync(b, store)
		}
		st := b.State()
		if keep && (st.Replicas != 2 || st.Reserved != 1) {
			t.Errorf("with the heartbeat alone: b counts %d replicas, %d reserved; want 2, 1", st.Replicas, st.Reserved)
		}
		if !keep && st.Replicas != 1 {
			t.Errorf("without it: b counts %d replicas, want 1 (a forgotten)", st.Replicas)
		}
	}
}
