package chaos_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The three cluster modules' replicas against one redis-server through a
// seeded random schedule of bounded faults, one at a time (issue 48, part
// 3): a replica paused (SIGSTOP) or killed and restarted (one bin/caddy, one
// bin/coredns); Redis paused (SIGSTOP), under CLIENT PAUSE, or killed and
// restarted empty; an ACL change on one replica's user; one replica's link
// delayed past the deadlines, or resetting. Every second it checks each
// README's rules (checks_test.go):
//   - peer_rate_limit: what the cluster admits of one peer offered 3R
//     (60/30/10 over the replicas) in every 2 s window, within a tolerance
//     of the total the README's rules give for the faults in it
//     (windows_test.go; a window a host stall touched is not measured);
//   - latency_bucket: no (user, app) pair answered by two publishers in
//     turn (one switch allowed: a pending pin reconciled);
//   - ogs: one probe run per new location where the store allowed it, one
//     order on both replicas within the README's bound of the store
//     answering again (Redis restarted empty too: Cluster, rule 6);
//   - every admin view's store health true to what its store calls did,
//     and the reason it names the one the fault in force gives them.
//
// It prints the seed; CHAOS_SEED=<seed> replays the schedule (and logs
// what each bin/caddy replica admitted per 0.5 s).
//
// Seen failing on: the other replicas not leaving a cut-off replica's
// fallback share (internal/quota: 1.29–1.30 R in a resetting link's
// steady windows); a random pick instead of the rendezvous one
// (internal/pubsel: pairs on two publishers in turn through the Redis
// faults); ogs' convergence step left out (internal/ogs: locations probed
// on both replicas during CLIENT PAUSE still apart 4.8 s after it). The
// bands taking the replica count the README's fallback rule uses (a killed
// replica's registration, live for replica_ttl, counted in it) fail on the
// earlier fixed count (seed 2159: 0.805 R with R ÷ 4 each, want ≥ 0.87);
// expecting another reason than an ACL's noperm fails the reason check;
// a location asked just before Redis' restart empty stored on one replica
// and probed again on the other answered two orders after it (seed 2159,
// before ogs' rule 6).
func TestFaultSchedule(t *testing.T) {
	e2e.SkipShort(t)
	s := seed(t)
	t.Logf("seed %d (replay: CHAOS_SEED=%d go test ./chaos/ -run TestFaultSchedule -v)", s, s)
	rng := rand.New(rand.NewPCG(s, 0))
	faults := schedule(rng, 5)
	c := startCluster(t)
	c.waitReady()

	tl := &timeline{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	rl := c.startRLLoad(stop, &wg)
	lb := c.startLBLoad(rand.New(rand.NewPCG(s, 1)), stop, &wg)
	ch := newChecker(c, tl, rl)
	ch.from = time.Now().Add(4 * time.Second) // shares from the floor to proportional; first probes
	wg.Add(2)
	go func() { defer wg.Done(); ch.run(stop) }()
	go func() { defer wg.Done(); ch.ogsRounds(stop) }()

	time.Sleep(time.Until(ch.from))
	for _, f := range faults {
		time.Sleep(f.gap)
		t.Logf("%s: %s", time.Now().Format("15:04:05.000"), f)
		c.apply(tl, f)
	}
	time.Sleep(5 * time.Second) // calm: the last fault's after-effects, within the READMEs' bounds
	close(stop)
	wg.Wait()

	pairs, flips := lb.flips()
	for _, f := range flips {
		ch.violate("latency_bucket: a pair on two publishers in turn:%s", f)
	}
	ch.unseenFaults()
	t.Logf("peer_rate_limit: %d requests failed, %d answered; windows checked by band: %v; skipped: %d under-offered, %d touched by a host stall",
		rl.failed.Load(), rl.completed.Load(), ch.bands, ch.skipped, ch.stalledWins)
	t.Logf("latency_bucket: %d pairs, %d answers, %d failed", pairs, len(lb.events), lb.failed)
	t.Logf("ogs: %d rounds of new locations checked at one run each, %d at most one run per replica, %d skipped",
		ch.ogsStrict, ch.ogsRelaxed, ch.ogsSkipped)
	t.Logf("store calls that timed out in calm (a loaded host's late answers, allowed): %d", ch.stalls)
	if ch.windows() < 10 {
		ch.violate("only %d peer_rate_limit windows checked: the host was too loaded to offer 3R", ch.windows())
	}
	ch.report(t, s)
	if t.Failed() || os.Getenv("CHAOS_SEED") != "" { // a replay shows the parts of every window
		rl.logSlices(t)
	}
}

// waitReady waits for the three bin/caddy replicas registered (each sees
// three) and both ogs views healthy.
func (c *cluster) waitReady() {
	for _, r := range c.caddies {
		r.proc().WaitFor(c.t, "three replicas registered", 30*time.Second, func() error {
			if v := r.rlView(); v == nil || !v.RedisHealthy || v.ReplicasSeen != 3 {
				return fmt.Errorf("view %+v", v)
			}
			return nil
		})
	}
	for _, r := range c.dns {
		r.proc().WaitFor(c.t, "ogs view", 30*time.Second, func() error {
			if v := r.ogsView(); v == nil || v.RedisHealthy == nil || !*v.RedisHealthy {
				return fmt.Errorf("view %+v", v)
			}
			return nil
		})
	}
}
