package quotaredis

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/quota"
)

// simStore is a real store whose clock (TIME) is the test's simulated
// clock, for tests that step time faster than it passes.
type simStore struct {
	*Store
	now func() time.Time
}

func (s simStore) Sync(ctx context.Context, b *quota.Batch) (*quota.Answer, error) {
	as, err := s.SyncGroup(ctx, []*quota.Batch{b})
	if err != nil {
		return nil, err
	}
	return as[0], nil
}

func (s simStore) SyncGroup(ctx context.Context, bs []*quota.Batch) ([]*quota.Answer, error) {
	as, err := s.Store.SyncGroup(ctx, bs)
	for i, a := range as {
		if bs[i].Time && a.TimeErr == nil {
			a.Time = s.now()
		}
	}
	return as, err
}

// redisReplicas returns n replicas over one real redis-server, each with
// its own client (as separate processes would have), a 1 s interval, on
// the simulated clock now.
func redisReplicas(t *testing.T, addr string, n int, now func() time.Time) ([]*quota.Quota, []*redis.Client) {
	t.Helper()
	var qs []*quota.Quota
	var cs []*redis.Client
	for i := range n {
		c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		q, err := quota.NewWithClock(quota.Config{Prefix: "es:peer_rate_limit:http/x/p", Replica: "r" + string(rune('0'+i)),
			Limit: 100, Interval: time.Second}, simStore{New(c), now}, now)
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
		cs = append(cs, c)
	}
	return qs, cs
}

// midEpoch returns the middle of the epoch after now's (1 s epochs).
func midEpoch(now time.Time) time.Time {
	return now.Truncate(time.Second).Add(1500 * time.Millisecond)
}

// TestRedisStore runs the sync against a real redis-server: the keys are
// the documented ones, two replicas divide the limit by demand, values that
// another program wrote under the prefix are ignored and counted, and a
// Redis stopped mid-test makes the replicas fall back, then resync.
func TestRedisStore(t *testing.T) {
	e2e.SkipShort(t)
	dir := t.TempDir()
	addr := e2e.Addr(t)
	srv := e2e.StartRedisAt(t, dir, addr)
	// Epoch e: replica 0 sees 30 requests of peer "a", replica 1 sees 10.
	now := midEpoch(time.Now())
	qs, cs := redisReplicas(t, addr, 2, func() time.Time { return now })
	ctx := context.Background()
	prefix := qs[0].Config().Prefix
	for i := range 40 {
		qs[min(i/30, 1)].Allow("a", now.UnixNano())
	}
	for _, q := range qs {
		if err := q.Sync(ctx, now); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	e := qs[0].Epoch(now)
	key := quota.PeerKey(prefix, "a", e)
	if !strings.HasPrefix(key, "{"+prefix+":a}:") {
		t.Fatalf("peer key %q is not hash-tagged by prefix and peer", key)
	}
	got, err := cs[0].HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Both replicas started at the floor share: 10 % of 100/s ÷ 1 replica
	// = 10/s, burst 2 → each admitted a few; all 40 are demand.
	if got["d"] != "40" {
		t.Fatalf("HGETALL %s = %v, want d=40", key, got)
	}
	if ttl := cs[0].PTTL(ctx, key).Val(); ttl <= 0 || ttl > 3*time.Second {
		t.Fatalf("PTTL %s = %v, want ≤ 3 intervals", key, ttl)
	}
	if n := cs[0].ZCard(ctx, quota.ReplicasKey(prefix)).Val(); n != 2 {
		t.Fatalf("ZCARD replicas = %d, want 2", n)
	}

	// Epoch e+1: more traffic, then the sync reads epoch e's totals: the
	// cluster demanded 40 per epoch against a limit of 100, so each gets
	// its demand and half the rest — 30+30 and 10+30.
	now = now.Add(time.Second)
	for i := range 4 {
		qs[min(i/3, 1)].Allow("a", now.UnixNano())
	}
	for _, q := range qs {
		if err := q.Sync(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []float64{60, 40} {
		if s, _ := qs[i].Share("a"); s < want-0.01 || s > want+0.01 {
			t.Errorf("replica %d share = %.2f/s, want %.0f", i, s, want)
		}
		if st := qs[i].State(); st.Replicas != 2 || !st.Healthy || st.Fallback || st.Malformed != 0 {
			t.Errorf("replica %d state = %+v", i, st)
		}
	}

	// Another program's keys under the prefix: a string where epoch e+1's
	// hash of peer "b" will be read, a non-integer field in the hash that
	// this epoch's counts of "c" go to, and a non-number in epoch e+1's
	// totals of "a". Each is ignored and counted, never a limit.
	now = now.Add(time.Second)
	e = qs[0].Epoch(now)
	cs[0].Set(ctx, quota.PeerKey(prefix, "b", e-1), "not a hash", 0)
	cs[0].HSet(ctx, quota.PeerKey(prefix, "c", e), "d", "lots")
	cs[0].HSet(ctx, quota.PeerKey(prefix, "a", e-1), "d", "12x")
	q := qs[0]
	for _, p := range []string{"a", "b", "c"} {
		q.Allow(p, now.UnixNano())
	}
	before, _ := q.Share("a")
	if err := q.Sync(ctx, now); err != nil {
		t.Fatal(err)
	}
	st := q.State()
	// "a": a total that does not parse; "b": HMGET of the string answers
	// WRONGTYPE; "c": HINCRBY on "lots" fails.
	if st.Malformed < 3 {
		t.Errorf("malformed = %d after three bad values, want ≥ 3 (state %+v)", st.Malformed, st)
	}
	if after, _ := q.Share("a"); after != before {
		t.Errorf("share of a changed from %.2f to %.2f on a total that did not parse", before, after)
	}
	if !st.Healthy || st.Fallback {
		t.Errorf("malformed values made the store unhealthy: %+v", st)
	}
	// A replicas key of the wrong type: the last known count stays.
	cs[0].Del(ctx, quota.ReplicasKey(prefix))
	cs[0].Set(ctx, quota.ReplicasKey(prefix), "x", 0)
	m := q.State().Malformed
	now = now.Add(time.Second)
	if err := q.Sync(ctx, now); err != nil {
		t.Fatal(err)
	}
	if st := q.State(); st.Malformed <= m || st.Replicas != 2 {
		t.Errorf("replicas key of the wrong type: malformed %d → %d, replicas %d (want the last known 2)", m, st.Malformed, st.Replicas)
	}
	cs[0].Del(ctx, quota.ReplicasKey(prefix))

	// Redis stopped: the round trip fails, every share is limit ÷ 2.
	srv.Stop()
	now = now.Add(time.Second)
	q.Allow("a", now.UnixNano())
	if err := q.Sync(ctx, now); err == nil {
		t.Fatal("sync with Redis stopped succeeded")
	}
	st = q.State()
	if st.Healthy || !st.Fallback || st.StoreErrors == 0 || st.LastError == "" {
		t.Fatalf("state with Redis stopped = %+v", st)
	}
	if s, _ := q.Share("a"); s != 50 {
		t.Fatalf("fallback share = %.2f/s, want 100 ÷ 2 replicas = 50", s)
	}

	// Back on the same address: the next sync succeeds and re-registers.
	e2e.StartRedisAt(t, dir, addr)
	now = now.Add(time.Second)
	q.Allow("a", now.UnixNano())
	ok := false
	for range 20 { // the client may need a moment to reconnect
		if err := q.Sync(ctx, now); err == nil {
			ok = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ok {
		t.Fatalf("no successful sync after Redis came back: %+v", q.State())
	}
	if st := q.State(); !st.Healthy || st.Fallback {
		t.Fatalf("state after Redis came back = %+v", st)
	}
	if n := cs[0].ZCard(ctx, quota.ReplicasKey(prefix)).Val(); n != 1 {
		t.Fatalf("ZCARD after restart = %d, want 1 (this replica re-registered)", n)
	}
}

// redisClient is a client as the replicas' (user may be "").
func redisClient(t *testing.T, addr, user, pass string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// offerEpoch offers n requests of peer spread over one 1 s epoch starting
// at from, round robin over the replicas, and returns the admitted count.
func offerEpoch(qs []*quota.Quota, peer string, from time.Time, n int) int {
	admitted := 0
	for k := range n {
		if qs[k%len(qs)].Allow(peer, from.Add(time.Duration(k)*time.Second/time.Duration(n)).UnixNano()) {
			admitted++
		}
	}
	return admitted
}

// TestRedisStoreTrouble drives the store-error branches with a real
// redis-server: an ACL user that may touch only the replicas key
// (NOPERM on every peer's key: those peers at the fallback share, the
// limit held), maxmemory 1 with noeviction (OOM on the heartbeat: every
// share the fallback), a read-only replica (READONLY) and a paused server
// (CLIENT PAUSE past the read timeout: a timeout, bounded). Each says
// which key and why, and the next good sync resyncs.
func TestRedisStoreTrouble(t *testing.T) {
	e2e.SkipShort(t)
	_, addr := e2e.StartRedis(t)
	admin := redisClient(t, addr, "", "")
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "part", "on", ">pw", "~*:replicas", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	const limit = 100.0
	now := midEpoch(time.Now())
	clock := func() time.Time { return now }
	var qs []*quota.Quota
	for i := range 3 {
		q, err := quota.NewWithClock(quota.Config{Prefix: "es:trouble", Replica: fmt.Sprintf("r%d", i), Limit: limit, Interval: time.Second},
			simStore{New(redisClient(t, addr, "part", "pw")), clock}, clock)
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	syncAll := func(now time.Time) {
		for _, q := range qs {
			_ = q.Sync(ctx, now)
		}
	}

	// ACL: three replicas, 3R offered over 3 epochs; the heartbeat works,
	// every peer command is refused.
	syncAll(now)
	admitted := 0
	for i := range 3 {
		a := offerEpoch(qs, "a", now, 300)
		now = now.Add(time.Second)
		syncAll(now)
		if i > 0 {
			admitted += a
		}
	}
	t.Logf("ACL user allowed only the replicas key: %d admitted in 2 s of a %.0f/s limit", admitted, limit)
	if r := float64(admitted) / (2 * limit); r < 0.95 || r > 1.05 {
		t.Errorf("admitted ÷ limit = %.3f under NOPERM on the peers' keys, want the fallback rule's 1 ± 0.05", r)
	}
	for i, q := range qs {
		st := q.State()
		tr := q.Troubles(0)
		if st.Healthy || st.Replicas != 3 || st.FallbackPeers != 1 || st.Errors["noperm"] == 0 || !strings.Contains(st.LastError, "NOPERM") ||
			len(tr) != 1 || tr[0].Reason != "noperm" || !strings.HasPrefix(tr[0].Key, "{es:trouble:a}:") {
			t.Errorf("replica %d under NOPERM: state %+v troubles %+v", i, st, tr)
		}
		if s, _ := q.Share("a"); math.Abs(s-limit/3) > 1e-9 {
			t.Errorf("replica %d share %.2f, want the fallback %.2f", i, s, limit/3)
		}
	}

	// From here one replica, the default user.
	q, err := quota.NewWithClock(quota.Config{Prefix: "es:trouble2", Replica: "solo", Limit: limit, Interval: time.Second},
		simStore{New(admin), clock}, clock)
	if err != nil {
		t.Fatal(err)
	}
	wantWhole := func(what, reason string) {
		t.Helper()
		q.Allow("a", now.UnixNano())
		start := time.Now()
		err := q.Sync(ctx, now)
		if took := time.Since(start); took > 3*300*time.Millisecond {
			t.Errorf("%s: sync took %v, want ≤ 3 × the 300ms read timeout", what, took)
		}
		st := q.State()
		if err == nil || st.Healthy || !st.Fallback || st.Errors[reason] == 0 || !strings.Contains(st.LastError, quota.ReplicasKey("es:trouble2")) && reason != "timeout" {
			t.Errorf("%s: err %v, state %+v, want the whole quota in fallback for %s", what, err, st, reason)
		}
		if s, _ := q.Share("a"); st.Replicas != 1 || s != limit {
			t.Errorf("%s: share %.2f, replicas %d, want limit ÷ 1 (the last known replica count)", what, s, st.Replicas)
		}
		now = now.Add(time.Second)
	}
	wantHealthy := func(what string) {
		t.Helper()
		q.Allow("a", now.UnixNano())
		var err error
		for range 10 {
			if err = q.Sync(ctx, now); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if st := q.State(); err != nil || !st.Healthy || st.Fallback {
			t.Errorf("after %s: %v, state %+v", what, err, st)
		}
		now = now.Add(time.Second)
	}
	wantHealthy("start")

	admin.ConfigSet(ctx, "maxmemory-policy", "noeviction")
	admin.ConfigSet(ctx, "maxmemory", "1")
	wantWhole("maxmemory 1, noeviction", "oom")
	admin.ConfigSet(ctx, "maxmemory", "0")
	wantHealthy("OOM")

	if err := admin.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	wantWhole("a read-only replica", "readonly")
	admin.Do(ctx, "REPLICAOF", "NO", "ONE")
	wantHealthy("READONLY")

	if err := admin.Do(ctx, "CLIENT", "PAUSE", "1500").Err(); err != nil {
		t.Fatal(err)
	}
	wantWhole("CLIENT PAUSE 1500", "timeout")
	admin.Do(ctx, "CLIENT", "UNPAUSE")
	wantHealthy("CLIENT PAUSE")
}

// The heartbeat's mark on a real redis-server: a Reserving batch writes
// its score negated and field r of the peers it counts; one ZCOUNT counts
// the marked replicas and the live ones that missed their last sync
// (heartbeat before Fresh); one ZREMRANGEBYSCORE removes the silent ones,
// marked or not.
func TestHeartbeatMark(t *testing.T) {
	e2e.SkipShort(t)
	_, addr := e2e.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	s, ctx := New(c), context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	batch := func(replica string, at time.Time, reserving bool, counts ...quota.Count) *quota.Answer {
		t.Helper()
		a, err := s.Sync(ctx, &quota.Batch{Prefix: "m", Replica: replica, Now: at, ReplicaTTL: time.Second, KeyTTL: time.Second,
			Epoch: 7, Counts: counts, Read: []string{"x"}, Reserving: reserving, Fresh: now.Add(-375 * time.Millisecond)})
		if err != nil || a.ReplicasErr != nil {
			t.Fatalf("sync of %s: %v, %v", replica, err, a.ReplicasErr)
		}
		return a
	}
	batch("stale", now.Add(-500*time.Millisecond), false)
	batch("gone", now.Add(-1500*time.Millisecond), true)
	batch("marked", now, true, quota.Count{Peer: "x", Admitted: 1, Demanded: 2})
	a := batch("fine", now, false, quota.Count{Peer: "x", Admitted: 3, Demanded: 4})
	if a.Replicas != 3 || a.Reserved != 2 {
		t.Errorf("replicas %d, reserved %d: want 3 live (the one silent past the TTL removed), 2 of them counted at the fallback share", a.Replicas, a.Reserved)
	}
	if sc, err := c.ZScore(ctx, quota.ReplicasKey("m"), "marked").Result(); err != nil || sc != -float64(now.UnixMilli()) {
		t.Errorf("marked replica's score %v (%v), want %d", sc, err, -now.UnixMilli())
	}
	if v, err := c.HGetAll(ctx, quota.PeerKey("m", "x", 7)).Result(); err != nil || v["a"] != "4" || v["d"] != "6" || v["r"] != "1" {
		t.Errorf("x's epoch hash %v (%v), want a 4, d 6, r 1 (one marked replica counted it)", v, err)
	}
}
