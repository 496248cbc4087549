package peerratelimit

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/quotaredis"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// keepAlive writes a profile's heartbeat alone while its syncs fail
// (quota.KeepAlive), on a client of its own whose read and write
// deadlines are replica_ttl: a link slower than the sync's deadline drops
// the sync's connection at every sync, and a new connection's set-up
// (HELLO's round trip) then outlasts the next one's deadline, so no
// heartbeat landed and the others forgot this replica after replica_ttl
// (the delayed link of TestClusterOneReplicaCutOff admitted 1.24–1.34 R
// with the default replica_ttl). One heartbeat at a time, at most one per
// sync interval.
type keepAlive struct {
	mu      sync.Mutex
	running bool      // a heartbeat or a warming PING is under way
	warmed  time.Time // last PING sent
	wg      sync.WaitGroup
	client  redis.UniversalClient // nil until the first failed sync
	of      redis.UniversalClient // the store's client it copies
	ttl     time.Duration
}

// keepWarm is how often the heartbeat client's idle connection is used
// (PING) while the syncs succeed: a connection go-redis dialed but never
// used has not done its set-up, and one the server or a middlebox
// dropped is dialed anew; a PING does the set-up ahead of need.
const keepWarm = time.Minute

// warmKeepAlive makes the heartbeat client for spec's store ahead of
// need, and PINGs it every keepWarm (in the background, one at a time).
func (c *cluster) warmKeepAlive(ctx context.Context) {
	k := &c.keepAlive
	cfg := c.q.Load().Config()
	client := k.clientFor(c.spec.Load(), cfg.ReplicaTTL)
	k.mu.Lock()
	defer k.mu.Unlock()
	if client == nil || k.running || time.Since(k.warmed) < keepWarm || ctx.Err() != nil {
		return
	}
	k.warmed, k.running = time.Now(), true
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		pctx, cancel := context.WithTimeout(ctx, 2*cfg.ReplicaTTL)
		client.Ping(pctx) // its error is the syncs' to tell
		cancel()
		k.mu.Lock()
		k.running = false
		k.mu.Unlock()
	}()
}

// startKeepAlive runs the heartbeats in the background until a sync
// succeeds or ctx ends (a no-op while they run).
func (c *cluster) startKeepAlive(ctx context.Context) {
	k := &c.keepAlive
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running || ctx.Err() != nil {
		return
	}
	k.running = true
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		for {
			q, spec := c.q.Load(), c.spec.Load()
			cfg := q.Config()
			client := k.clientFor(spec, cfg.ReplicaTTL)
			start := monoclock.Now()
			var sent bool
			if client != nil {
				// Each round trip may take replica_ttl (the client's read
				// and write deadlines), the first one's connection set-up
				// as much again: a heartbeat given up drops its connection,
				// and each next one would pay a new set-up again.
				hctx, cancel := context.WithTimeout(ctx, 2*cfg.ReplicaTTL)
				sent, _ = q.KeepAlive(hctx, quotaredis.New(client), start)
				cancel()
			}
			k.mu.Lock()
			if !sent || ctx.Err() != nil {
				k.running = false
				k.mu.Unlock()
				return
			}
			k.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(start.Add(cfg.Interval))):
			}
		}
	}()
}

// clientFor returns the heartbeat client for spec's store, made anew
// when the store or replica_ttl changed (nil if it cannot be made). It
// keeps one connection open, with deadlines of replica_ttl.
func (k *keepAlive) clientFor(spec *clusterSpec, ttl time.Duration) redis.UniversalClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil && k.of == spec.conn.Client && k.ttl == ttl {
		return k.client
	}
	if k.client != nil {
		k.client.Close()
		k.client = nil
	}
	cfg := spec.conn.Config
	cfg.ReadTimeout, cfg.WriteTimeout, cfg.PoolSize = redisconn.Duration(ttl), redisconn.Duration(ttl), 1
	o, err := cfg.Universal()
	if err != nil {
		return nil
	}
	// One connection, kept open and ready (warmKeepAlive's PING set it
	// up, and it is never closed for idleness): the first heartbeat after
	// the syncs begin to fail then lands half a round trip after it is
	// sent, not after a connection's set-up too (HELLO's round trip: on
	// a link of 432 ms round trip, past replica_ttl from the last
	// heartbeat that landed).
	o.ConnMaxIdleTime = -1
	client := redis.NewUniversalClient(o)
	k.client, k.of, k.ttl, k.warmed = client, spec.conn.Client, ttl, time.Time{}
	return client
}

// stop waits for the heartbeats to end (their ctx done) and closes the
// client.
func (k *keepAlive) stop() {
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil {
		k.client.Close()
		k.client = nil
	}
}
