package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// The faults, each bounded and one at a time (the READMEs' rules are per
// fault). A one-sided fault (acl, delay, reset) hits one replica's path to
// Redis while the others' are fine.
const (
	pauseReplica = "replica paused (SIGSTOP)"
	killReplica  = "replica killed and restarted"
	redisStop    = "Redis paused (SIGSTOP)"
	clientPause  = "Redis CLIENT PAUSE"
	redisRestart = "Redis killed and restarted empty"
	aclChange    = "ACL change refusing the replica's keys"
	linkDelay    = "replica's link delayed 216 ms each way"
	linkReset    = "replica's link resetting"
)

type fault struct {
	id     int
	kind   string
	target int // index in cluster.all(); -1 for Redis
	dur    time.Duration
	gap    time.Duration // calm before it
	start  time.Time
	end    time.Time // zero while in force
}

func (f *fault) String() string {
	return fmt.Sprintf("%s on %d for %v", f.kind, f.target, f.dur.Round(10*time.Millisecond))
}

func (f *fault) oneSided() bool {
	return f.kind == aclChange || f.kind == linkDelay || f.kind == linkReset
}

func (f *fault) redisWide() bool {
	return f.kind == redisStop || f.kind == clientPause || f.kind == redisRestart
}

// schedule draws each kind of fault once, in a random order, on random
// targets, with random durations (one-sided faults 4–6 s, so that a 2 s
// window lies in their steady state) and calm gaps of 1.5–3 s. At least
// one one-sided fault is on a bin/caddy replica.
func schedule(rng *rand.Rand, replicas int) []*fault {
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	kinds := []string{pauseReplica, killReplica, pauseReplica, killReplica, redisStop, clientPause, redisRestart, aclChange, linkDelay, linkReset}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var out []*fault
	caddyHit, seen := false, map[string]int{}
	for _, k := range kinds {
		f := &fault{kind: k, target: -1, gap: between(1500*time.Millisecond, 3*time.Second)}
		seen[k]++
		switch k {
		case pauseReplica, killReplica:
			// The first of each kind on a bin/caddy replica, the second on
			// a bin/coredns one.
			if seen[k] == 1 {
				f.target = rng.IntN(3)
			} else {
				f.target = 3 + rng.IntN(replicas-3)
			}
			f.dur = between(500*time.Millisecond, 2*time.Second)
			if k == killReplica {
				f.dur = between(time.Second, 3*time.Second)
			}
		case redisStop, redisRestart:
			f.dur = between(time.Second, 3*time.Second)
		case clientPause:
			f.dur = between(time.Second, 2500*time.Millisecond)
		default:
			f.target = rng.IntN(replicas)
			caddyHit = caddyHit || f.target < 3
			f.dur = between(4*time.Second, 6*time.Second)
		}
		out = append(out, f)
	}
	if !caddyHit {
		for _, f := range out {
			if f.kind == aclChange {
				f.target = rng.IntN(3)
			}
		}
	}
	return out
}

// timeline is the faults applied so far, for the checks.
type timeline struct {
	mu     sync.Mutex
	faults []*fault
}

func (tl *timeline) add(f *fault) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	f.start = time.Now()
	f.id = len(tl.faults)
	tl.faults = append(tl.faults, f)
}

func (tl *timeline) over(f *fault) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	f.end = time.Now()
}

// each calls fn with every fault so far and its end (now while in force).
func (tl *timeline) each(fn func(f *fault, end time.Time)) {
	tl.mu.Lock()
	fs := make([]fault, len(tl.faults))
	for i, f := range tl.faults {
		fs[i] = *f
	}
	tl.mu.Unlock()
	for i := range fs {
		end := fs[i].end
		if end.IsZero() {
			end = time.Now()
		}
		fn(&fs[i], end)
	}
}

// apply runs one fault for its duration.
func (c *cluster) apply(tl *timeline, f *fault) {
	ctx := context.Background()
	var r *replica
	if f.target >= 0 {
		r = c.all()[f.target]
	}
	var on, off func()
	switch f.kind {
	case pauseReplica:
		on = func() { r.proc().Signal(syscall.SIGSTOP) }
		off = func() { r.proc().Signal(syscall.SIGCONT) }
	case killReplica:
		on = func() { r.proc().Kill() }
		off = func() { r.start(c.t) }
	case redisStop:
		on = func() { c.redisProc().Signal(syscall.SIGSTOP) }
		off = func() { c.redisProc().Signal(syscall.SIGCONT) }
	case clientPause:
		on = func() {
			if err := c.admin.Do(ctx, "CLIENT", "PAUSE", f.dur.Milliseconds(), "ALL").Err(); err != nil {
				c.t.Errorf("CLIENT PAUSE: %v", err)
			}
		}
		off = func() {}
	case redisRestart:
		on = func() { c.redisProc().Kill() }
		off = c.startRedis
	case aclChange:
		// A bin/caddy replica keeps its heartbeat (the replicas key) and
		// loses every other key; a bin/coredns one loses all.
		keys := []any{}
		if f.target < 3 {
			keys = []any{"~{" + rlPrefix + "}:replicas"}
		}
		on = func() { c.acl(r.user, keys...) }
		off = func() { c.acl(r.user, "~*") }
	case linkDelay:
		on = func() { r.link.Delay(216 * time.Millisecond) }
		off = r.link.Pass
	case linkReset:
		marker := "ZADD" // peer_rate_limit's sync pipeline
		if f.target >= 3 {
			marker = "EVAL" // ogs' scripts
		}
		on = func() { r.link.ResetOn(marker) }
		off = r.link.Pass
	}
	tl.add(f)
	on()
	time.Sleep(f.dur)
	off()
	tl.over(f)
}

func (c *cluster) acl(user string, keys ...any) {
	args := append([]any{"ACL", "SETUSER", user, "resetkeys"}, keys...)
	// Redis may be paused by nothing else now (one fault at a time), but
	// a busy host may delay the answer: retry a few times.
	var err error
	for range 5 {
		if err = c.admin.Do(context.Background(), args...).Err(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Errorf("ACL SETUSER %s: %v", user, err)
}
