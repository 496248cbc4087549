package quota

import (
	"context"
	"fmt"
	"time"
)

// KeepAlive writes this replica's heartbeat alone (ZADD, ZREMRANGEBYSCORE,
// ZCARD, ZCOUNT: no counts, no reads), marked, through store, when its
// last sync failed as a whole; it reports whether it sent one. So a
// replica whose link is slower than the sync's deadline but not than
// ReplicaTTL stays, to the others, live at its fallback share (they
// leave room for it) instead of expiring while it goes on enforcing that
// share. store should be a connection of deadlines near ReplicaTTL and
// ctx bounded by it: a sync's own connection is dropped at its deadline,
// and on such a link a new one's set-up alone outlasts the next.
//
// Safe beside Sync (it reads no sync state but the clock's offset and
// the state's Fallback); a heartbeat that lands after a later sync's is
// marked as that sync's is (the first after a failure, and the one
// after it, are marked: see prepare).
func (q *Quota) KeepAlive(ctx context.Context, store Store, now time.Time) (bool, error) {
	if !q.KeepAliveNeeded() {
		return false, nil
	}
	e := q.Epoch(now)
	b := &Batch{
		Prefix: q.cfg.Prefix, Replica: q.cfg.Replica, Now: q.storeTime(now), Epoch: e,
		ReplicaTTL: q.cfg.ReplicaTTL, KeyTTL: 3 * q.cfg.Interval,
		Fresh: time.Unix(0, (e-1)*int64(q.cfg.Interval)), Reserving: true,
	}
	ans, err := store.Sync(ctx, b)
	if err == nil && ans == nil {
		err = fmt.Errorf("store gave no answer")
	}
	if err == nil && ans.ReplicasErr != nil {
		err = fmt.Errorf("heartbeat %s: %w", ReplicasKey(b.Prefix), ans.ReplicasErr)
	}
	return true, err
}

// KeepAliveNeeded reports whether the last sync failed as a whole (the
// heartbeat alone is then due: KeepAlive).
func (q *Quota) KeepAliveNeeded() bool { return q.State().Fallback }
