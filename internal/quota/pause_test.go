package quota

import (
	"context"
	"testing"
	"time"
)

// pauseRun is three replicas with even demand (demand per second per
// replica) on the simulated clock; replica 0 is paused (SIGSTOP, a GC
// pause, VM steal) from pauseAt for pause: it neither syncs nor decides,
// and the requests sent to it meanwhile wait in its socket and are decided
// at once when it resumes. It returns the admissions per 10 ms slot and
// the slot of replica 0's first sync after the pause.
func pauseRun(t *testing.T, limit, demand float64, pauseAt, pause, total time.Duration) (slots []int, firstSync int) {
	return faultRun(t, limit, demand, pauseAt, pause, total, false)
}

// faultRun is pauseRun; with stall, the store instead stalls from
// pauseAt for pause: every replica's syncs meanwhile time out (the sync's
// deadline), and each replica goes on deciding.
func faultRun(t *testing.T, limit, demand float64, pauseAt, pause, total time.Duration, stall bool) (slots []int, firstSync int) {
	c := newCluster(t, 3, []string{"x"}, Config{Prefix: "p", Limit: limit})
	const step = time.Millisecond
	const slot = 10 * time.Millisecond
	slots = make([]int, total/slot)
	firstSync = -1
	start := c.now
	queued := 0
	for c.now.Sub(start) < total {
		el := c.now.Sub(start)
		paused := el >= pauseAt && el < pauseAt+pause
		if stall {
			if paused {
				c.store.SetDown(context.DeadlineExceeded)
			} else {
				c.store.SetDown(nil)
			}
			paused = false
		}
		for i, q := range c.reps {
			ns := c.now.UnixNano()
			c.acc[i][0] += demand * step.Seconds()
			for c.acc[i][0] >= 1 {
				c.acc[i][0]--
				if i == 0 && paused {
					queued++
					continue
				}
				n := 1
				if i == 0 {
					n, queued = queued+1, 0
				}
				for range n {
					if q.Allow("x", ns) {
						slots[el/slot]++
					}
				}
			}
			if i == 0 && paused {
				continue
			}
			if c.next[i].IsZero() {
				c.next[i] = q.NextSync(c.now).Add(time.Duration(i) * time.Millisecond)
			}
			if !c.now.Before(c.next[i]) {
				_ = q.Sync(context.Background(), c.now)
				c.next[i] = q.NextSync(c.now).Add(time.Duration(i) * time.Millisecond)
				if i == 0 && el >= pauseAt+pause && firstSync < 0 {
					firstSync = int(el / slot)
				}
			}
		}
		c.now = c.now.Add(step)
	}
	return slots, firstSync
}

// windows returns the least and most admitted in any 1 s window of slots
// (10 ms each) starting at from or later.
func windows(slots []int, from int) (lo, hi int) {
	lo = 1 << 30
	for s := from; s+100 <= len(slots); s++ {
		n := 0
		for _, v := range slots[s : s+100] {
			n += v
		}
		lo, hi = min(lo, n), max(hi, n)
	}
	return lo, hi
}

// A replica paused for longer than a sync (300 ms, 600 ms, 1.5 s; sync
// 250 ms, replica TTL 1 s), as the README states it. With 3R offered
// (R per replica): no 1 s window admits more than R plus the shares'
// bursts (1.1 R); from the paused replica's first sync after the pause,
// none admits below 0.9 R. A returning replica takes, until it reads an
// epoch with its counts, only what the others leave (they admitted into
// its room meanwhile); keeping its share of before admitted 1.12–1.17 R.
func TestPausedReplica(t *testing.T) {
	const limit = 300.0
	for _, pause := range []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond, 1500 * time.Millisecond} {
		slots, first := pauseRun(t, limit, limit, 5*time.Second, pause, 12*time.Second)
		_, hiAll := windows(slots, 300)
		lo, hi := windows(slots, first)
		t.Logf("pause %v: 1 s windows from 3 s: most %d; from its first sync after the pause: least %d, most %d (R %v)", pause, hiAll, lo, hi, limit)
		if float64(lo) < 0.9*limit || float64(hiAll) > 1.1*limit {
			t.Errorf("pause %v: 1 s windows between %d (from the first sync after it) and %d, want within 0.9 R and 1.1 R of R = %v", pause, lo, hiAll, limit)
		}
	}
}

// The same pauses with 0.6 R offered (0.2 R per replica): what the
// others leave is the returning replica's demand, so from its first sync
// after the pause no 1 s window admits below 0.95 of the demand (the
// floor share instead admitted 0.87).
func TestPausedReplicaBelowLimit(t *testing.T) {
	const limit = 300.0
	const offered = 3 * limit / 5
	for _, pause := range []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond, 1500 * time.Millisecond} {
		slots, first := pauseRun(t, limit, limit/5, 5*time.Second, pause, 12*time.Second)
		lo, hi := windows(slots, first)
		t.Logf("pause %v: from its first sync after the pause: least %d, most %d (offered %v)", pause, lo, hi, offered)
		if float64(lo) < 0.95*offered {
			t.Errorf("pause %v: a 1 s window admitted %d of %v offered", pause, lo, offered)
		}
	}
}

// A store stall of 300 ms and 600 ms (sync 250 ms): the syncs meanwhile
// time out and every replica enforces the fallback share, limit ÷ 3, so
// with 3R offered no 1 s window admits more than 1.1 R, and from the
// first sync after the stall none admits below 0.9 R.
func TestStoreStall(t *testing.T) {
	const limit = 300.0
	for _, stall := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond} {
		slots, first := faultRun(t, limit, limit, 5*time.Second, stall, 12*time.Second, true)
		_, hiAll := windows(slots, 300)
		lo, hi := windows(slots, first)
		t.Logf("stall %v: 1 s windows from 3 s: most %d; from the first sync after it: least %d, most %d (R %v)", stall, hiAll, lo, hi, limit)
		if float64(lo) < 0.9*limit || float64(hiAll) > 1.1*limit {
			t.Errorf("stall %v: 1 s windows between %d and %d, want within 0.9 R and 1.1 R of R = %v", stall, lo, hiAll, limit)
		}
	}
}

// A replica back from a pause (600 ms: longer than a sync, shorter than
// the replica TTL) whose peer stopped sending to it right after its last
// sync before the pause and sent to another replica meanwhile: at its
// first sync after the pause the peer is idle there and its counts of the
// epoch before are missing because the replica wrote none, not because a
// sync failed, so the peer falls to the floor share at once. Keeping its
// share of before (the whole limit) lets the peer's next burst there add
// a limit on top of what the replica that took its room admits.
func TestReturningReplicaDropsIdlePeersToTheFloor(t *testing.T) {
	const limit = 300.0
	c := newCluster(t, 3, []string{"x"}, Config{Prefix: "p", Limit: limit})
	on := 0 // the replica the peer sends to
	demand := func(rep, _ int) float64 {
		if rep == on {
			return limit
		}
		return 0
	}
	c.run(3*time.Second, demand)
	for c.next[0].IsZero() || c.local(0).Before(c.next[0]) {
		c.run(time.Millisecond, demand)
	}
	on = 1 // from replica 0's sync in this step on, none to it
	c.run(time.Millisecond, demand)
	before, _ := c.reps[0].Share("x")
	if before < 0.9*limit {
		t.Fatalf("at its last sync before the pause replica 0's share of x is %.1f/s, want about the limit %v", before, limit)
	}
	c.alive[0] = false
	c.run(600*time.Millisecond, demand)
	c.alive[0] = true
	c.run(time.Millisecond, demand) // its sync was due during the pause: it syncs at once
	after, ok := c.reps[0].Share("x")
	floor := 0.1 * limit / 3
	t.Logf("replica 0's share of x: %.1f/s at its last sync before the pause, %.1f/s at its first after it (floor %.1f/s)", before, after, floor)
	if !ok || after > floor+1e-9 {
		t.Errorf("at its first sync after the pause replica 0's share of the idle peer x is %.1f/s (tracked %v), want the floor %.1f/s", after, ok, floor)
	}
}
