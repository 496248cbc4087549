package chaos_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ogsBound is how long after the store answers again two ogs replicas may
// answer one location differently: the README's two re-check intervals
// plus a store timeout (2.25 s with recheck off), twice, for a loaded host
// (as TestClusterConvergesAfterRedisPause allows).
const ogsBound = 2 * (2*time.Second + 250*time.Millisecond)

// checker checks the READMEs' rules every second and keeps what broke them.
type checker struct {
	c    *cluster
	tl   *timeline
	rl   *rlLoad
	from time.Time // checks start (after the warm-up)

	mu          sync.Mutex
	violations  []string
	bands       map[string]bandSeen // peer_rate_limit windows checked, by band
	skipped     int                 // peer_rate_limit windows under-offered
	stalledWins int                 // peer_rate_limit windows touched by a host stall
	nextWin     int
	stalls      int
	samples     []sample
	seen        map[string]bool // fault id/module/replica: the view said unhealthy while it was in force
	diverged    map[string]time.Time
	asked       map[string]time.Time // ogs location: when ogsRounds asked it first
	ogsLastBad  time.Time
	ogsStrict   int
	ogsRelaxed  int
	ogsSkipped  int
}

// bandSeen is the windows checked against one band: how many, and the
// least and most admitted (× R).
type bandSeen struct {
	n      int
	lo, hi float64
}

func (b bandSeen) String() string { return fmt.Sprintf("%d windows %.3f–%.3f R", b.n, b.lo, b.hi) }

// sample is one second's reading of the bin/caddy replicas' views.
type sample struct {
	at         time.Time
	syncFailed [3]bool // the replica's sync_errors_total grew since the last sample
	syncErrors [3]uint64
	procs      [3]int64 // the replica's start, to tell a restart
}

func newChecker(c *cluster, tl *timeline, rl *rlLoad) *checker {
	return &checker{c: c, tl: tl, rl: rl, bands: map[string]bandSeen{}, seen: map[string]bool{}, diverged: map[string]time.Time{},
		asked: map[string]time.Time{}}
}

func (ch *checker) violate(format string, args ...any) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.violations = append(ch.violations, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (ch *checker) report(t *testing.T, seed uint64) {
	for i, v := range ch.violations {
		if i == 30 {
			t.Errorf("… and %d more", len(ch.violations)-30)
			break
		}
		t.Error(v)
	}
	if t.Failed() {
		t.Logf("seed %d: replay with CHAOS_SEED=%d", seed, seed)
	}
}

func (ch *checker) windows() (n int) {
	for _, v := range ch.bands {
		n += v.n
	}
	return n
}

func (ch *checker) run(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if time.Now().After(ch.from) {
			ch.tick()
		}
	}
}

// near reports a fault touching replica idx (or Redis as a whole) in force
// at some time in [at-settle, at].
func (ch *checker) near(idx int, at time.Time, settle time.Duration) (hit bool) {
	ch.tl.each(func(f *fault, end time.Time) {
		if (f.redisWide() || f.target == idx) && !f.start.After(at) && end.Add(settle).After(at) {
			hit = true
		}
	})
	return hit
}

// mark records the faults a module's view of replica idx said unhealthy
// under: those in force, or ended within grace. latency_bucket's spell
// begins at its third call without an answer, 1 s after the first at the
// least, and lasts until a ping a second answers (its README): read once a
// second, it may show only after the fault (seed 424242: Redis restarted
// empty for 2.81 s, caddy2's view not read unhealthy within 100 ms of
// its end; it passed on replay).
func (ch *checker) mark(module string, idx int, unhealthy bool) {
	if !unhealthy {
		return
	}
	grace := 100 * time.Millisecond
	if module == "lb" {
		grace = 1100 * time.Millisecond
	}
	ch.tl.each(func(f *fault, end time.Time) {
		if !end.Before(time.Now().Add(-grace)) {
			ch.mu.Lock()
			ch.seen[fmt.Sprintf("%d/%s/%d", f.id, module, idx)] = true
			ch.mu.Unlock()
		}
	})
}

// steady returns the fault on replica idx's store path in force at now
// for a second or more (its store calls since fail because of it), or nil.
func (ch *checker) steady(idx int, now time.Time) (in *fault) {
	ch.tl.each(func(f *fault, end time.Time) {
		if (f.redisWide() || (f.oneSided() && f.target == idx)) && f.end.IsZero() && now.Sub(f.start) >= time.Second {
			in = f
		}
	})
	return in
}

// faultReason is the reason a store call under fault f fails with: the
// store's error reply (ACL: noperm) or no answer (timeout); "" where
// several fit (a link reset, Redis restarting: reset, refused, closed…).
func faultReason(f *fault) string {
	switch f.kind {
	case aclChange:
		return "noperm"
	case linkDelay, redisStop, clientPause:
		return "timeout"
	}
	return ""
}

// reasonTrue: a view naming store trouble under fault f in steady state
// names the reason its store calls got (true to what they did), or a
// timeout (a loaded host's late answer).
func (ch *checker) reasonTrue(module string, r *replica, f *fault, reason string) {
	if f == nil {
		return
	}
	if want := faultReason(f); want != "" && reason != "" && reason != want && reason != "timeout" {
		ch.violate("%s %s: store trouble %q under %s, whose calls get %q", module, r.name, reason, f, want)
	}
}

// tick reads every view once and checks the store health each shows, the
// peer_rate_limit windows now complete, and the ogs orders.
func (ch *checker) tick() {
	now := time.Now()
	s := sample{at: now}
	var wg sync.WaitGroup
	rls, lbs := make([]*rlCluster, 3), make([]*lbStore, 3)
	ogs := make([]*ogsServer, 2)
	for i, r := range ch.c.caddies {
		s.procs[i] = r.started.Load()
		wg.Add(2)
		go func() { defer wg.Done(); rls[i] = r.rlView() }()
		go func() { defer wg.Done(); lbs[i] = r.lbView() }()
	}
	for i, r := range ch.c.dns {
		wg.Add(1)
		go func() { defer wg.Done(); ogs[i] = r.ogsView() }()
	}
	wg.Wait()
	ch.mu.Lock()
	var prev *sample
	if len(ch.samples) > 0 {
		prev = &ch.samples[len(ch.samples)-1]
	}
	for i, v := range rls {
		if v != nil {
			s.syncErrors[i] = v.SyncErrors
			s.syncFailed[i] = prev != nil && prev.procs[i] == s.procs[i] && v.SyncErrors > prev.syncErrors[i]
		}
	}
	ch.samples = append(ch.samples, s)
	ch.mu.Unlock()

	for i, r := range ch.c.caddies {
		ch.checkRL(i, r, rls[i], now)
		ch.checkLB(i, r, lbs[i], now)
	}
	for j, r := range ch.c.dns {
		ch.checkOGSHealth(3+j, r, ogs[j], now)
	}
	ch.checkWindows()
	if ogs[0] != nil && ogs[1] != nil {
		ch.checkOrders(ogs[0], ogs[1], now)
	}
}

// checkRL: peer_rate_limit's view says healthy exactly when its last sync
// succeeded for every key (fallback and fallback peers agree with it), and
// neither healthy nor on the fallback share while it is starting (no sync
// ended yet: no last_attempt; at the earlier commit the check took that
// for a broken view, seed 1796363545376628428 on caddy3 just restarted),
// healthy in calm (a sync timed out on a loaded host is counted as a
// stall, any other reason breaks the rule), unhealthy under a fault on
// its store path.
func (ch *checker) checkRL(i int, r *replica, v *rlCluster, now time.Time) {
	if v == nil {
		return
	}
	if v.RedisHealthy && (v.Fallback || v.FallbackPeers > 0) {
		ch.violate("peer_rate_limit %s: redis_healthy with fallback %v, fallback_peers %d", r.name, v.Fallback, v.FallbackPeers)
	}
	if v.LastAttempt == "" { // starting: no sync ended yet (README: Cluster, Replicas)
		if v.RedisHealthy || v.Fallback || v.FallbackPeers > 0 {
			ch.violate("peer_rate_limit %s: no sync ended, yet %+v", r.name, *v)
		}
		if r.since() > 3*time.Second {
			ch.violate("peer_rate_limit %s: no sync ended 3 s after its start", r.name)
		}
		return
	}
	if !v.RedisHealthy && !v.Fallback && v.FallbackPeers == 0 {
		ch.violate("peer_rate_limit %s: not healthy, yet no peer on the fallback share: %+v", r.name, *v)
	}
	ch.mark("rl", i, !v.RedisHealthy)
	if !v.RedisHealthy {
		ch.reasonTrue("peer_rate_limit", r, ch.steady(i, now), v.LastErrorReason)
	}
	if r.since() > 3*time.Second && !ch.near(i, now, 3*time.Second) && !v.RedisHealthy {
		if v.LastErrorReason == "timeout" {
			ch.mu.Lock()
			ch.stalls++
			ch.mu.Unlock()
		} else {
			ch.violate("peer_rate_limit %s: not healthy 3 s after any fault (%s): %+v", r.name, v.LastErrorReason, *v)
		}
	}
}

// checkLB: latency_bucket's store is healthy 4 s after any fault on its
// path (a ping a second ends an unreachable spell; a call that timed out
// on a loaded host is a stall), and refusing only
// within 11 s of an ACL change on its user (refusing ends 10 s after the
// last refused key).
func (ch *checker) checkLB(i int, r *replica, v *lbStore, now time.Time) {
	if v == nil {
		return
	}
	ch.mark("lb", i, !v.Healthy || v.Refusing)
	if f := ch.steady(i, now); !v.Healthy {
		ch.reasonTrue("latency_bucket", r, f, v.LastReason)
	} else if v.Refusing && f != nil && f.kind == aclChange {
		ch.reasonTrue("latency_bucket (refused)", r, f, v.RefusedReason)
	}
	if r.since() < 4*time.Second {
		return
	}
	if !v.Healthy && !ch.near(i, now, 4*time.Second) {
		if v.LastReason == "timeout" { // a loaded host's late answers, as for the others
			ch.mu.Lock()
			ch.stalls++
			ch.mu.Unlock()
		} else {
			ch.violate("latency_bucket %s: store unhealthy 4 s after any fault (%s)", r.name, v.LastReason)
		}
	}
	acl := false
	ch.tl.each(func(f *fault, end time.Time) {
		acl = acl || (f.kind == aclChange && f.target == i && end.Add(11*time.Second).After(now))
	})
	if v.Refusing && !acl {
		ch.violate("latency_bucket %s: refusing with no ACL change on its user in the last 11 s", r.name)
	}
}

// checkOGSHealth: redis_healthy is true exactly when no key is in
// trouble, and true 4 s after any fault on its path (a store call that
// timed out on a loaded host, within 3 s, is a stall).
func (ch *checker) checkOGSHealth(idx int, r *replica, v *ogsServer, now time.Time) {
	if v == nil || v.RedisHealthy == nil {
		return
	}
	healthy := *v.RedisHealthy
	if healthy != (len(v.RedisTroubles) == 0) {
		ch.violate("ogs %s: redis_healthy %v with %d troubles", r.name, healthy, len(v.RedisTroubles))
	}
	ch.mark("ogs", idx, !healthy)
	if healthy {
		return
	}
	if f := ch.steady(idx, now); f != nil {
		for _, tr := range v.RedisTroubles {
			if !tr.Since.Before(f.start) {
				ch.reasonTrue("ogs", r, f, tr.Reason)
			}
		}
	}
	ch.mu.Lock()
	ch.ogsLastBad = now
	ch.mu.Unlock()
	if r.since() < 4*time.Second || ch.near(idx, now, 4*time.Second) {
		return
	}
	for _, tr := range v.RedisTroubles {
		if tr.Reason != "timeout" || now.Sub(tr.Since) > 3*time.Second {
			ch.violate("ogs %s: keys %s in trouble (%s since %s) 4 s after any fault", r.name, tr.Keys, tr.Reason, tr.Since.Format("15:04:05.000"))
			return
		}
	}
	ch.mu.Lock()
	ch.stalls++
	ch.mu.Unlock()
}

// unseenFaults: a fault on a module's store path, long enough for its
// README's rule to call the store unhealthy, was seen so in its view.
func (ch *checker) unseenFaults() {
	ch.tl.each(func(f *fault, end time.Time) {
		need := func(module string, idx int) {
			if !ch.seen[fmt.Sprintf("%d/%s/%d", f.id, module, idx)] {
				ch.violate("%s: %s's view of %s never said unhealthy while it was in force", f, module, ch.c.all()[idx].name)
			}
		}
		for i := range 3 {
			if (f.redisWide() && f.dur >= 1500*time.Millisecond) || (f.oneSided() && f.target == i) {
				need("rl", i)
			}
			// latency_bucket calls Redis on a local miss only (new pairs, a
			// few a second): unreachable needs 3 calls without an answer
			// over at least 1 s.
			if ((f.kind == redisStop || f.kind == redisRestart) && f.dur >= 2500*time.Millisecond) ||
				((f.kind == linkDelay || f.kind == aclChange) && f.target == i) {
				need("lb", i)
			}
		}
		// ogs calls Redis for a new location (ogsRounds asks two each
		// round; a loaded host may hold a round back) or a result to take
		// back: a fault with no round asked in it may see no call.
		asked := false
		for _, at := range ch.asked {
			asked = asked || (!at.Before(f.start) && at.Before(end.Add(-500*time.Millisecond)))
		}
		for j := 3; j < 5; j++ {
			if asked && ((f.redisWide() && f.dur >= 2500*time.Millisecond) || (f.oneSided() && f.target == j)) {
				need("ogs", j)
			}
		}
	})
}

// checkOrders: a location both ogs replicas hold has one order, at the
// latest ogsBound after the later of its first differing reading, the end
// of the last fault on ogs' path and the last store trouble either view
// showed.
func (ch *checker) checkOrders(a, b *ogsServer, now time.Time) {
	orders := map[string][]string{}
	for _, l := range a.Locations {
		orders[l.Location] = l.Order
	}
	since := time.Time{}
	ch.tl.each(func(f *fault, end time.Time) {
		if (f.redisWide() || f.target >= 3) && end.After(since) {
			since = end
		}
	})
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.ogsLastBad.After(since) {
		since = ch.ogsLastBad
	}
	for _, l := range b.Locations {
		oa, ok := orders[l.Location]
		if !ok {
			continue
		}
		if slices.Equal(oa, l.Order) {
			delete(ch.diverged, l.Location)
			continue
		}
		first, ok := ch.diverged[l.Location]
		if !ok {
			first = now
			ch.diverged[l.Location] = now
		}
		from := first
		if since.After(from) {
			from = since
		}
		if now.Sub(from) > ogsBound && !first.IsZero() {
			ch.violations = append(ch.violations, fmt.Sprintf("%s ogs %s: orders %s and %s, %v after the store answered again (bound %v)",
				now.Format("15:04:05.000"), l.Location, strings.Join(oa, ","), strings.Join(l.Order, ","), now.Sub(from).Round(time.Millisecond), ogsBound))
			ch.diverged[l.Location] = time.Time{} // reported once
		}
	}
}
