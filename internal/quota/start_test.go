package quota

import (
	"context"
	"testing"
	"time"
)

// A replica that has not finished its first sync is *starting* (README,
// Cluster, Replicas): it has asked the store nothing yet, so its state is
// neither healthy nor on the fallback share (Healthy, Fallback false, no
// FallbackPeers, no LastAttempt), and a new peer starts at the floor share
// of limit ÷ ExpectedReplicas. Its first sync makes it healthy (the store
// answered) or puts it on the fallback share (the store did not), and
// sets LastAttempt either way: the view tells starting from unhealthy by
// last_attempt alone.
func TestStateBeforeFirstSync(t *testing.T) {
	const limit = 300.0
	for _, down := range []bool{false, true} {
		store := NewFakeStore()
		if down {
			store.SetDown(Reply("LOADING Redis is loading the dataset in memory"))
		}
		q, err := New(Config{Prefix: "p", Replica: "r1", Limit: limit, ExpectedReplicas: 3}, store)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		q.Allow("a", now.UnixNano())
		st := q.State()
		if st.Healthy || st.Fallback || st.FallbackPeers != 0 || !st.LastAttempt.IsZero() || !st.LastSync.IsZero() {
			t.Fatalf("before the first sync: %+v, want starting (neither healthy nor fallback, no attempt)", st)
		}
		if s, _ := q.Share("a"); s != limit*0.1/3 {
			t.Fatalf("before the first sync: share %v, want the floor %v", s, limit*0.1/3)
		}
		err = q.Sync(context.Background(), now.Add(q.cfg.Interval))
		st = q.State()
		switch {
		case st.LastAttempt.IsZero():
			t.Fatalf("store down %v: no last attempt after the first sync: %+v", down, st)
		case down && (err == nil || st.Healthy || !st.Fallback || st.FallbackPeers != 1):
			t.Fatalf("store down: first sync %v, state %+v, want the fallback share for the one peer", err, st)
		case !down && (err != nil || !st.Healthy || st.Fallback):
			t.Fatalf("store up: first sync %v, state %+v, want healthy", err, st)
		}
	}
}
