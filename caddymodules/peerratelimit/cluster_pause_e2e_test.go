package peerratelimit_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Three bin/caddy replicas share peer a's limit; one of them is paused
// (SIGSTOP) for 600 ms, longer than two syncs, while all three take a's
// requests: the requests sent to it wait and are decided when it
// resumes; no request fails, and over the window the three admit no
// more than the limit plus their shares' bursts and at least 0.9 of it.
// (The returning replica's share rule is measured finely on the engine,
// TestPausedReplica: a window this coarse cannot tell 1.05 R from 1.15 R.)
func TestClusterPausedReplica(t *testing.T) {
	e2e.SkipShort(t)
	_, redisAddr := e2e.StartRedis(t)
	rs := []*replica{startReplica(t, redisAddr), startReplica(t, redisAddr), startReplica(t, redisAddr)}
	for _, r := range rs {
		waitCluster(t, r.c, "three replicas registered", func(v *peerratelimit.ClusterView) bool {
			return v.RedisHealthy && v.ReplicasSeen == 3
		})
	}
	bursts(t, rs, 2*time.Second, "settle")
	paused := rs[2].c.Proc
	t.Cleanup(func() { paused.Signal(syscall.SIGCONT) })
	out := duringFault(t, rs, 5*time.Second, "pause", func() {
		time.Sleep(time.Second)
		if err := paused.Signal(syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
		time.Sleep(600 * time.Millisecond)
		if err := paused.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
	})
	admittedWithin(t, out, "a replica paused 600 ms", 0.9)
	waitCluster(t, rs[2].c, "the paused replica synced again", func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 3
	})
	admittedWithin(t, bursts(t, rs, 3*time.Second, "after"), "after", 0.9)
}
