package peerratelimit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/quota"
)

// The cluster limit on a replicated 3-master Redis Cluster and on a
// Sentinel-watched master, through two bin/caddy replicas each: steady,
// the two together admit the limit; while the shard that holds a peer's
// keys fails over (its master killed, its replica promoted after the node
// timeout) or Sentinel moves the master, no request fails, the
// replicas admit at most the limit (the fallback rule: limit ÷ replicas
// each for the keys in trouble), the view names the trouble, and after
// it they admit the limit again.

// modeReplicas starts two replicas whose edgesteer_redis main block has
// the given address lines, waits until both see two replicas, and lets
// the shares settle from the floor.
func modeReplicas(t *testing.T, store string) []*replica {
	rs := []*replica{startReplica(t, store), startReplica(t, store)}
	for _, r := range rs {
		waitCluster(t, r.c, "two replicas registered", func(v *peerratelimit.ClusterView) bool {
			return v.RedisHealthy && v.ReplicasSeen == 2
		})
	}
	bursts(t, rs, 2*time.Second, "settle")
	return rs
}

// admittedWithin checks the sum of the replicas' admissions over a phase:
// at most the limit (plus each share's burst) and, if least > 0, at
// least least × the limit.
func admittedWithin(t *testing.T, out []*outcome, phase string, least float64) {
	t.Helper()
	var ok int64
	var d time.Duration
	for _, o := range out {
		ok += o.ok.Load()
		d = max(d, o.elapsed)
	}
	hi := most(hangRate, len(out)*clusterBurst(hangRate), d)
	t.Logf("%s: %d admitted in %v by the replicas together at a cluster limit of %d/s: %.3f × the limit", phase, ok, d, hangRate,
		float64(ok)/(hangRate*d.Seconds()))
	if ok > hi || float64(ok) < least*hangRate*d.Seconds() {
		t.Fatalf("%s: the replicas admitted %d in %v, want at most %d and at least %.0f", phase, ok, d, hi, least*hangRate*d.Seconds())
	}
}

// duringFault sends bursts to both replicas for d while fault runs.
func duringFault(t *testing.T, rs []*replica, d time.Duration, phase string, fault func()) []*outcome {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(300 * time.Millisecond) // the bursts are under way
		fault()
	}()
	out := bursts(t, rs, d, phase)
	wg.Wait()
	return out
}

func TestClusterOnRedisCluster(t *testing.T) {
	e2e.SkipShort(t)
	rc := e2e.StartReplicatedRedisCluster(t, 3)
	rs := modeReplicas(t, strings.Join(rc.Addrs[:3], " "))
	admittedWithin(t, bursts(t, rs, 4*time.Second, "steady"), "steady", 0.9)

	// Peer a's keys live on one shard (hash-tagged by prefix and peer): its
	// master dies while both replicas take a's requests.
	prefix := rs[0].view(t).KeyPrefix
	key := quota.PeerKey(prefix, "a", 0)
	var dead int
	out := duringFault(t, rs, 8*time.Second, "failover", func() { dead = rc.FailMaster(t, key) })
	admittedWithin(t, out, "failover", 0)
	for i, r := range rs {
		v := r.view(t)
		t.Logf("replica %d after the failover of %s: healthy %v, errors %v, last error %q", i, rc.Addrs[dead], v.RedisHealthy, v.ErrorsByReason, v.LastError)
		if len(v.ErrorsByReason) == 0 {
			t.Errorf("replica %d: the shard's failover left no store error in the view: %+v", i, v)
		}
	}
	for _, r := range rs {
		waitAnswering(t, r, 2)
	}
	bursts(t, rs, 2*time.Second, "resettle")
	admittedWithin(t, bursts(t, rs, 4*time.Second, "after the failover"), "after the failover", 0.9)
}

func TestClusterOnSentinel(t *testing.T) {
	e2e.SkipShort(t)
	s := e2e.StartSentinel(t)
	rs := modeReplicas(t, fmt.Sprintf("%s\n\t\tsentinel_master %s", s.SentinelAddr, s.Master))
	admittedWithin(t, bursts(t, rs, 4*time.Second, "steady"), "steady", 0.9)

	out := duringFault(t, rs, 8*time.Second, "failover", func() { s.Failover(t) })
	admittedWithin(t, out, "failover", 0)
	// The replicas follow Sentinel to the promoted master: their heartbeat
	// is there (a smooth failover may cost no sync at all, so no fallback
	// need be logged).
	prefix := rs[0].view(t).KeyPrefix
	rc := redis.NewClient(&redis.Options{Addr: s.ReplAddr})
	defer rc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for rc.ZCard(context.Background(), quota.ReplicasKey(prefix)).Val() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the promoted master %s never held both replicas' heartbeats", s.ReplAddr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, r := range rs {
		v := waitCluster(t, r.c, "healthy after the failover", func(v *peerratelimit.ClusterView) bool {
			return v.RedisHealthy && !v.Fallback && v.ReplicasSeen == 2
		})
		t.Logf("replica %d after the failover: errors %v, last error %q", i, v.ErrorsByReason, v.LastError)
	}
	bursts(t, rs, 2*time.Second, "resettle")
	admittedWithin(t, bursts(t, rs, 4*time.Second, "after the failover"), "after the failover", 0.9)
}
