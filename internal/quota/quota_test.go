package quota

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// t0 is an epoch boundary; the simulated clock starts there.
var t0 = time.Unix(1_700_000_000, 0)

// cluster is replicas over one fake store on a simulated clock.
type cluster struct {
	t     *testing.T
	now   time.Time
	store *FakeStore
	reps  []*Quota
	alive []bool
	acc   [][]float64 // fractional requests owed, per replica and peer
	adm   [][]int     // admitted, per replica and peer
	dem   [][]int
	peers []string
	skew  []time.Duration // replica i's clock is the store's + skew[i]
	next  []time.Time     // replica i's next sync, on its clock
	// static anchors: per-replica GCRA at a fixed rate, per replica and peer
	static   []*ratelimit.Rule
	sbuckets [][][]ratelimit.Bucket // per anchor, replica, peer
	sadm     [][]int                // per anchor, peer
}

func newCluster(t *testing.T, n int, peers []string, cfg Config) *cluster {
	return skewedCluster(t, peers, cfg, make([]time.Duration, n))
}

// skewedCluster is a cluster whose replica i's clock is skew[i] off the
// store's (the fake store keeps the simulated true time).
func skewedCluster(t *testing.T, peers []string, cfg Config, skew []time.Duration) *cluster {
	c := &cluster{t: t, now: t0, store: NewFakeStore(), peers: peers, skew: skew}
	c.store.Now = func() time.Time { return c.now }
	for i := range skew {
		cf := cfg
		cf.Replica = fmt.Sprintf("r%d", i)
		q, err := NewWithClock(cf, c.store, func() time.Time { return c.local(i) })
		if err != nil {
			t.Fatal(err)
		}
		c.reps = append(c.reps, q)
		c.alive = append(c.alive, true)
		c.next = append(c.next, time.Time{})
		c.acc = append(c.acc, make([]float64, len(peers)))
		c.adm = append(c.adm, make([]int, len(peers)))
		c.dem = append(c.dem, make([]int, len(peers)))
	}
	return c
}

// local is replica i's clock.
func (c *cluster) local(i int) time.Time { return c.now.Add(c.skew[i]) }

// anchor adds a per-replica static limit of rate for comparison.
func (c *cluster) anchor(rate float64) {
	r, err := ratelimit.NewRule("", rate, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	c.static = append(c.static, r)
	b := make([][]ratelimit.Bucket, len(c.reps))
	for i := range b {
		b[i] = make([]ratelimit.Bucket, len(c.peers))
	}
	c.sbuckets = append(c.sbuckets, b)
	c.sadm = append(c.sadm, make([]int, len(c.peers)))
}

// run advances the clock by d in 1 ms steps. demand(replica, peer) is the
// rate offered there, evenly spaced. Live replicas sync when their own
// clock says (Quota.NextSync: the middle of each epoch), replica i i ms
// late (timer jitter), and decide on their own clock.
func (c *cluster) run(d time.Duration, demand func(rep, peer int) float64) {
	end := c.now.Add(d)
	const step = time.Millisecond
	for c.now.Before(end) {
		for i, q := range c.reps {
			if !c.alive[i] {
				continue
			}
			local := c.local(i)
			ns := local.UnixNano()
			if c.next[i].IsZero() {
				c.next[i] = q.NextSync(local).Add(time.Duration(i) * time.Millisecond)
			}
			if !local.Before(c.next[i]) {
				_ = q.Sync(context.Background(), local)
				c.next[i] = q.NextSync(local).Add(time.Duration(i) * time.Millisecond)
			}
			for p, key := range c.peers {
				c.acc[i][p] += demand(i, p) * step.Seconds()
				for c.acc[i][p] >= 1 {
					c.acc[i][p]--
					c.dem[i][p]++
					if q.Allow(key, ns) {
						c.adm[i][p]++
					}
					for a, r := range c.static {
						if c.sbuckets[a][i][p].Allow(r, ns) {
							c.sadm[a][p]++
						}
					}
				}
			}
		}
		c.now = c.now.Add(step)
	}
}

func (c *cluster) admitted(peer int) (n int) {
	for i := range c.reps {
		n += c.adm[i][peer]
	}
	return n
}

func (c *cluster) reset() {
	for i := range c.reps {
		clear(c.adm[i])
		clear(c.dem[i])
	}
}

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %.3f, want %.3f ± %.3f", what, got, want, tol)
	}
}

// The goal of a cluster-wide limit: with demand split 80/10/10 across
// three replicas, the cluster admits the limit within 3 % over 10 s;
// per-replica static limits admit up to 3× (limit each) or starve the
// busy replica (limit/3 each).
func TestEightyTenTen(t *testing.T) {
	const limit = 1000.0
	for _, tc := range []struct {
		name   string
		total  float64
		static float64 // ratio the static per-replica limit admits
	}{
		{"demand 2x limit", 2 * limit, 1.4},
		{"demand 12x limit", 12 * limit, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, []string{"hss1"}, Config{Prefix: "p", Limit: limit})
			c.anchor(limit)
			c.anchor(limit / 3)
			split := []float64{0.8, 0.1, 0.1}
			c.run(10*time.Second, func(rep, _ int) float64 { return tc.total * split[rep] })
			got := float64(c.admitted(0)) / (limit * 10)
			t.Logf("quota: admitted/limit %.4f (replicas %d %d %d); static limit each: %.3f; static limit/3 each: %.3f",
				got, c.adm[0][0], c.adm[1][0], c.adm[2][0], float64(c.sadm[0][0])/(limit*10), float64(c.sadm[1][0])/(limit*10))
			if got < 0.97 || got > 1.03 {
				t.Errorf("admitted/limit = %.4f, want 0.97–1.03", got)
			}
			near(t, "static anchor, limit each", float64(c.sadm[0][0])/(limit*10), tc.static, 0.03)
			// The busy replica gets its proportional part, not limit/3.
			near(t, "busy replica's part", float64(c.adm[0][0])/float64(c.admitted(0)), 0.8, 0.03)
		})
	}
}

// Shares follow demand: 3:1 demand gives 3:1 shares of the limit.
func TestProportional(t *testing.T) {
	c := newCluster(t, 2, []string{"x"}, Config{Prefix: "p", Limit: 400})
	c.run(2*time.Second, func(rep, _ int) float64 { return []float64{900, 300}[rep] })
	a, _ := c.reps[0].Share("x")
	b, _ := c.reps[1].Share("x")
	near(t, "busy share", a, 300, 1)
	near(t, "other share", b, 100, 1)
	if st := c.reps[0].State(); st.Replicas != 2 || !st.Healthy || st.Fallback || st.Malformed != 0 {
		t.Errorf("state %+v", st)
	}
}

// A replica with no traffic for a peer others use admits at once at the
// floor, then gets its proportional share; a peer new to the cluster gets
// the equal share at the first sync.
func TestFloor(t *testing.T) {
	const limit = 300.0
	c := newCluster(t, 3, []string{"x"}, Config{Prefix: "p", Limit: limit, Floor: 0.1})
	c.run(2*time.Second, func(rep, _ int) float64 { return []float64{600, 600, 0}[rep] })
	if _, ok := c.reps[2].Share("x"); ok {
		t.Fatal("idle replica tracks the peer")
	}
	idle := c.reps[2]
	if !idle.Allow("x", c.now.UnixNano()) {
		t.Fatal("idle replica refused the first request")
	}
	s, _ := idle.Share("x")
	near(t, "floor share", s, 0.1*limit/3, 1e-9)
	c.reset()
	c.run(2*time.Second, func(rep, _ int) float64 { return 600 })
	s, _ = idle.Share("x")
	near(t, "share once busy", s, limit/3, 1)

	// New to the cluster: the first sync that sees it gives limit/replicas.
	for _, q := range c.reps {
		q.Allow("new", c.now.UnixNano())
	}
	c.run(c.reps[0].Config().Interval, func(int, int) float64 { return 0 })
	s, _ = c.reps[0].Share("new")
	near(t, "new peer's share", s, limit/3, 1e-9)
}

// A dead replica is, until its heartbeat expires (ReplicaTTL), a live
// replica that missed its last sync: the others leave room for its
// fallback share, as they must for one cut off from the store. Then its
// share returns to them at the next sync.
func TestDeadReplica(t *testing.T) {
	c := newCluster(t, 2, []string{"x"}, Config{Prefix: "p", Limit: 200})
	busy := func(int, int) float64 { return 400 }
	c.run(time.Second, busy)
	s, _ := c.reps[0].Share("x")
	near(t, "share of two", s, 100, 2)
	c.alive[1] = false
	iv := c.reps[0].Config().Interval
	c.run(2*iv, busy)
	s, _ = c.reps[0].Share("x")
	near(t, "share two intervals after the death (its fallback share left)", s, 100, 1e-9)
	if st := c.reps[0].State(); st.Reserved != 1 || st.Reserving {
		t.Errorf("state %+v, want the silent replica counted at its fallback share", st)
	}
	c.run(c.reps[0].Config().ReplicaTTL+iv, busy)
	if n := c.reps[0].State().Replicas; n != 1 {
		t.Errorf("replicas %d after the TTL, want 1", n)
	}
	s, _ = c.reps[0].Share("x")
	near(t, "share once its heartbeat expired", s, 200, 1e-9)
}

// Store down: shares fall back to limit ÷ last known replicas and the state
// says so; when it returns, the replica resyncs.
func TestStoreDown(t *testing.T) {
	const limit = 300.0
	c := newCluster(t, 3, []string{"x"}, Config{Prefix: "p", Limit: limit})
	demand := func(rep, _ int) float64 { return []float64{1600, 200, 200}[rep] }
	c.run(time.Second, demand)
	s, _ := c.reps[0].Share("x")
	near(t, "busy share", s, 0.8*limit, 3)
	c.store.SetDown(errors.New("connection refused"))
	c.run(c.reps[0].Config().Interval, demand)
	st := c.reps[0].State()
	if st.Healthy || !st.Fallback || st.StoreErrors == 0 || st.LastError != "connection refused" || st.Replicas != 3 {
		t.Errorf("state while down %+v", st)
	}
	s, _ = c.reps[0].Share("x")
	near(t, "fallback share", s, limit/3, 1e-9)
	c.run(time.Second, demand) // still down: stays
	s, _ = c.reps[0].Share("x")
	near(t, "fallback share later", s, limit/3, 1e-9)

	c.store.SetDown(nil)
	iv := c.reps[0].Config().Interval
	c.run(iv, demand)
	s, _ = c.reps[0].Share("x")
	near(t, "share on the first sync back (its last epoch unknown)", s, limit/3, 1e-9)
	if st := c.reps[0].State(); !st.Reserving {
		t.Errorf("state on the first sync back %+v, want its heartbeat marked", st)
	}
	// That sync wrote no counts (it was at the fallback share), so the
	// next keeps the fallback share one more interval.
	c.run(iv, demand)
	s, _ = c.reps[0].Share("x")
	near(t, "share on the second sync back (its counts of the first not written)", s, limit/3, 1e-9)
	c.run(iv, demand)
	st = c.reps[0].State()
	s, _ = c.reps[0].Share("x")
	near(t, "resynced share", s, 0.8*limit, 3)
	if !st.Healthy || st.Fallback || !st.LastSync.Equal(st.LastAttempt) {
		t.Errorf("state after resync %+v", st)
	}
}

// Store answers that do not parse are ignored and counted; the share in
// force stays.
func TestMalformed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(s *FakeStore, epoch int64)
	}{
		{"another program's string key", func(s *FakeStore, e int64) { s.Set(PeerKey("p", "x", e), []byte("hello")) }},
		{"not a number", func(s *FakeStore, e int64) { _ = s.HSet(PeerKey("p", "x", e), "d", []byte("1e9")) }},
		{"negative", func(s *FakeStore, e int64) { _ = s.HSet(PeerKey("p", "x", e), "d", []byte("-5")) }},
		{"huge", func(s *FakeStore, e int64) { _ = s.HSet(PeerKey("p", "x", e), "d", []byte("99999999999999")) }},
		{"below our own count", func(s *FakeStore, e int64) { _ = s.HSet(PeerKey("p", "x", e), "d", []byte("1")) }},
		{"bad admitted field", func(s *FakeStore, e int64) { _ = s.HSet(PeerKey("p", "x", e), "a", []byte("x")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, []string{"x"}, Config{Prefix: "p", Limit: 400})
			demand := func(rep, _ int) float64 { return []float64{900, 300}[rep] }
			c.run(time.Second, demand)
			q := c.reps[0]
			before, _ := q.Share("x")
			// Spoil the epoch the next sync reads, after everyone wrote it.
			iv := q.Config().Interval
			c.run(iv/4, demand)
			e := q.Epoch(q.NextSync(c.now))
			tc.spoil(c.store, e-1)
			c.run(iv, demand)
			st := q.State()
			if st.Malformed == 0 {
				t.Fatalf("malformed answer not counted: %+v", st)
			}
			if after, _ := q.Share("x"); after != before {
				t.Errorf("share changed on a malformed answer: %v → %v", before, after)
			}
			if !st.Healthy {
				t.Errorf("a malformed answer made the store unhealthy: %+v", st)
			}
		})
	}
	t.Run("replicas key of another type", func(t *testing.T) {
		c := newCluster(t, 1, []string{"x"}, Config{Prefix: "p", Limit: 400, ExpectedReplicas: 4})
		c.store.Set(ReplicasKey("p"), []byte("x"))
		iv := c.reps[0].Config().Interval
		c.run(iv, func(int, int) float64 { return 10 })
		if st := c.reps[0].State(); st.Malformed != 1 || st.Replicas != 4 || !st.Healthy {
			t.Errorf("state %+v, want malformed counted and replicas kept at 4", st)
		}
		// Repaired at the next sync: the key is ours again and counts.
		c.run(iv, func(int, int) float64 { return 10 })
		if st := c.reps[0].State(); st.Malformed != 1 || st.Repaired != 1 || st.Replicas != 1 {
			t.Errorf("state %+v, want the replicas key repaired (deleted, re-registered): 1 replica", st)
		}
	})
}

// Tracked peers are bounded; idle ones are dropped after IdleSyncs.
func TestBoundedPeers(t *testing.T) {
	now := time.Now()
	st := NewFakeStore()
	st.Now = func() time.Time { return now }
	q, err := NewWithClock(Config{Prefix: "p", Replica: "a", Limit: 100, MaxPeers: 10, IdleSyncs: 2}, st, st.Now)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		q.Allow(fmt.Sprintf("peer%d", i), now.UnixNano())
	}
	if s := q.State(); s.Overflowed != 90 {
		t.Errorf("overflowed %d, want 90", s.Overflowed)
	}
	if n := len(q.Shares(0)); n != 10 {
		t.Errorf("tracked %d, want 10", n)
	}
	for i := range 3 {
		now = now.Add(time.Second)
		if err := q.Sync(context.Background(), now); err != nil {
			t.Fatal(err)
		}
		if n := q.State().Peers; (i < 2 && n != 10) || (i == 2 && n != 0) {
			t.Errorf("sync %d: %d peers tracked", i, n)
		}
	}
	if !q.Allow("fresh", now.UnixNano()) {
		t.Error("a new peer was refused once there was room")
	}
}

// Dynamic throttling lowers every share of the global limit at once.
func TestThrottle(t *testing.T) {
	c := newCluster(t, 2, []string{"x"}, Config{Prefix: "p", Limit: 400})
	c.run(time.Second, func(rep, _ int) float64 { return []float64{900, 300}[rep] })
	c.reps[0].SetThrottle(50, c.now)
	s, _ := c.reps[0].Share("x")
	near(t, "throttled share", s, 150, 1)
	if st := c.reps[0].State(); st.Effective != 200 || st.Throttle != 50 {
		t.Errorf("state %+v", st)
	}
	c.reps[0].SetThrottle(100, c.now)
	if c.reps[0].Allow("x", c.now.Add(time.Hour).UnixNano()) {
		t.Error("admitted at 100% throttle")
	}
}

func TestPeerKey(t *testing.T) {
	for _, tc := range []struct{ peer, want string }{
		{"hss1.example.com", "{p:hss1.example.com}:7"},
		{"a}b{c%", "{p:a%7Db%7Bc%25}:7"},
	} {
		if got := PeerKey("p", tc.peer, 7); got != tc.want {
			t.Errorf("PeerKey(%q) = %q, want %q", tc.peer, got, tc.want)
		}
	}
	if PeerKey("p", "a}", 1) == PeerKey("p", "a%7D", 1) {
		t.Error("two peers share a key")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Limit: 1}, "replica name"},
		{Config{Replica: "a"}, "limit 0"},
		{Config{Replica: "a", Limit: 1, Floor: 2}, "floor 2"},
		{Config{Replica: "a", Limit: 1, Interval: time.Second, ReplicaTTL: time.Millisecond}, "replica TTL 1ms"},
		{Config{Replica: "a", Limit: 1, MaxPeers: -1}, "max peers -1"},
		{Config{Replica: "a", Limit: 1, Burst: -1}, "burst -1"},
	} {
		_, err := New(tc.cfg, NewFakeStore())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
}

// A profile's overall and message-type quotas sync in one round trip per
// replica per interval, with one heartbeat; the message-type quota takes
// the replica count from it and divides its own limit by demand.
func TestSyncGroupOneRoundTrip(t *testing.T) {
	st := NewFakeStore()
	now := time.Unix(1_000_000, 125*int64(time.Millisecond))
	st.Now = func() time.Time { return now }
	type rep struct{ overall, msg *Quota }
	var reps []rep
	for _, name := range []string{"a", "b"} {
		o, err := NewWithClock(Config{Prefix: "p", Replica: name, Limit: 400}, st, st.Now)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewWithClock(Config{Prefix: "p/message/gx-ccr-i", Replica: name, Limit: 100}, st, st.Now)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep{o, m})
	}
	demand := []float64{300, 100} // message requests per second at a, b
	const iv = 250 * time.Millisecond
	for range 12 {
		for i, r := range reps {
			n := int(demand[i] * iv.Seconds())
			for k := range n {
				ts := now.Add(time.Duration(k) * iv / time.Duration(n)).UnixNano()
				r.msg.Allow("x", ts)
				r.overall.Allow("x", ts)
			}
		}
		now = now.Add(iv)
		for _, r := range reps {
			for i, err := range SyncGroup(context.Background(), now, []*Quota{r.overall, r.msg}) {
				if err != nil {
					t.Fatalf("quota %d: %v", i, err)
				}
			}
		}
	}
	s := st.Stats()
	if s.RoundTrips != 26 {
		t.Errorf("%d round trips for 12 syncs of 2 replicas, want 26 (one per replica per sync, and each replica's clock probe before its first)", s.RoundTrips)
	}
	// Per replica per sync: TIME and the heartbeat (5) + per quota 3 per
	// counted peer + 1 per read peer, one busy peer in each: 13; and the
	// two probes' TIME.
	t.Logf("%d commands, %d bytes to the store, %d from it for 24 syncs: %.1f commands per sync", s.Commands, s.BytesIn, s.BytesOut, float64(s.Commands)/24)
	if want := int64(24*13 + 2); s.Commands != want {
		t.Errorf("%d commands, want %d (5 + Σ (3A + A') per sync, 1 per probe)", s.Commands, want)
	}
	if st.Keys() == 0 {
		t.Fatal("nothing stored")
	}
	for _, r := range reps {
		if n := r.msg.State().Replicas; n != 2 {
			t.Errorf("message quota sees %d replicas, want 2 (from the group's heartbeat)", n)
		}
	}
	a, _ := reps[0].msg.Share("x")
	b, _ := reps[1].msg.Share("x")
	near(t, "message share at a (demand 300 of 400)", a, 75, 3)
	near(t, "message share at b (demand 100 of 400)", b, 25, 3)
	// No heartbeat of the message quota's own: only the profile's
	// replicas key exists.
	if _, err := st.get(ReplicasKey("p/message/gx-ccr-i"), now, kindZset); err != nil {
		t.Fatal(err)
	}
	if k, _ := st.get(ReplicasKey("p/message/gx-ccr-i"), now, kindZset); k != nil {
		t.Error("the message quota registered replicas of its own")
	}
	if k, _ := st.get(ReplicasKey("p"), now, kindZset); k == nil || len(k.zset) != 2 {
		t.Errorf("profile replicas key %+v, want 2 members", k)
	}
}

// A refund gives back the share's admission and the admitted count.
func TestRefund(t *testing.T) {
	q, err := New(Config{Prefix: "p", Replica: "a", Limit: 10, Burst: 2}, NewFakeStore())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	n := 0
	for q.Allow("x", now) {
		n++
	}
	q.Refund("x", now)
	// The admitted count the next sync reports (Count.Admitted) is one
	// less: the refused message was not admitted.
	if a := q.peers["x"].admitted.Load(); a != uint64(n-1) {
		t.Errorf("admitted count %d after %d admissions and a refund, want %d", a, n, n-1)
	}
	if !q.Allow("x", now) {
		t.Errorf("refused after a refund (admitted %d before)", n)
	}
}

// Store trouble on some keys — an ACL user allowed only the replicas key,
// a Cluster shard down, a timeout that cut the pipeline after the
// heartbeat — puts exactly the peers of those keys on the fallback share
// (limit ÷ replicas), and the state says which and why; the other peers
// keep their proportional shares. A value that does not parse is not
// trouble: ignored, counted, repaired.
func TestStoreTroubleOnSomeKeys(t *testing.T) {
	const limit = 300.0
	for _, tc := range []struct {
		name, reason string
		err          error
	}{
		{"noperm", "noperm", Reply("NOPERM No permissions to access a key")},
		{"clusterdown", "clusterdown", Reply("CLUSTERDOWN The cluster is down")},
		{"tryagain", "tryagain", Reply("TRYAGAIN Multiple keys request during rehashing of slot")},
		{"moved", "moved", Reply("MOVED 3999 127.0.0.1:6381")},
		{"timeout", "timeout", os.ErrDeadlineExceeded},
		{"reset", "reset", syscall.ECONNRESET},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, []string{"bad", "good"}, Config{Prefix: "p", Limit: limit})
			demand := func(rep, _ int) float64 { return []float64{800, 100, 100}[rep] * 3 }
			c.run(time.Second, demand)
			c.store.SetDeny(func(key string) error {
				if strings.HasPrefix(key, "{p:bad}") {
					return tc.err
				}
				return nil
			})
			c.reset()
			c.run(2*time.Second, demand)
			for i, q := range c.reps {
				s, _ := q.Share("bad")
				near(t, fmt.Sprintf("replica %d share of bad", i), s, limit/3, 1e-9)
				st := q.State()
				if st.Healthy || st.Fallback || st.FallbackPeers != 1 || st.Errors[tc.reason] == 0 || st.Malformed != 0 ||
					!strings.Contains(st.LastError, "{p:bad}") {
					t.Errorf("replica %d state %+v, want unhealthy, one peer in fallback, %s counted, the key named", i, st, tc.reason)
				}
				tr := q.Troubles(0)
				if len(tr) != 1 || tr[0].Peer != "bad" || tr[0].Reason != tc.reason || !strings.HasPrefix(tr[0].Key, "{p:bad}:") {
					t.Errorf("replica %d troubles %+v", i, tr)
				}
			}
			// The limit is held by the fallback rule: 3 × limit ÷ 3.
			near(t, "bad admitted ÷ limit", float64(c.admitted(0))/(2*limit), 1, 0.05)
			// The other peer is untouched: proportional, the limit in total.
			s, _ := c.reps[0].Share("good")
			near(t, "good's busy share", s, 0.8*limit, 3)
			near(t, "good admitted ÷ limit", float64(c.admitted(1))/(2*limit), 1, 0.03)

			// Trouble gone: back to proportional shares, healthy.
			c.store.SetDeny(nil)
			c.run(time.Second, demand)
			st := c.reps[0].State()
			s, _ = c.reps[0].Share("bad")
			near(t, "bad's share after the trouble", s, 0.8*limit, 3)
			if !st.Healthy || st.FallbackPeers != 0 || len(c.reps[0].Troubles(0)) != 0 {
				t.Errorf("state after the trouble %+v, troubles %v", st, c.reps[0].Troubles(0))
			}
		})
	}
	t.Run("heartbeat refused", func(t *testing.T) {
		// NOPERM on the replicas key (an ACL user allowed only the peers'
		// keys): the count is unknown and this replica unregistered, so
		// every share is the fallback share.
		c := newCluster(t, 2, []string{"x"}, Config{Prefix: "p", Limit: limit})
		c.run(time.Second, func(int, int) float64 { return 600 })
		c.store.SetDeny(func(key string) error {
			if key == ReplicasKey("p") {
				return Reply("NOPERM No permissions to access a key")
			}
			return nil
		})
		c.run(time.Second, func(int, int) float64 { return 600 })
		st := c.reps[0].State()
		if st.Healthy || !st.Fallback || st.Errors["noperm"] == 0 || !strings.Contains(st.LastError, ReplicasKey("p")) || st.FallbackPeers != 1 {
			t.Errorf("state %+v", st)
		}
		s, _ := c.reps[0].Share("x")
		near(t, "fallback share", s, limit/2, 1e-9)
	})
}
