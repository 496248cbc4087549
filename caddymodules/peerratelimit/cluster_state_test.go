package peerratelimit

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// The cluster's concurrent parts in process, for the race detector (make
// test runs the adapters under -race -short, which skips every bin/caddy
// test): the sync loop (failing syncs against an address where nothing
// listens: logTrouble, metrics), requests deciding through Allow and a
// message type's quota, the admin view, throttle changes and reloads
// (update: a kept quota and a new one, a message type added and removed),
// the heartbeats written alone while the syncs fail, all at once; then
// stop.
func TestClusterConcurrentPartsUnderRace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every sync is refused at once
	client := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 20 * time.Millisecond, MaxRetries: -1})
	defer client.Close()
	// Config: the heartbeat client's (cluster_keepalive.go), to the same
	// address.
	conn := &redisstore.Conn{Name: "main", Client: client,
		Config: redisconn.Config{Addresses: []string{addr}, DialTimeout: redisconn.Duration(20 * time.Millisecond)}}
	spec := func(rate float64, interval time.Duration, withMessage bool) *clusterSpec {
		overall, err := ratelimit.NewRule("overall", rate, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := &clusterSpec{profile: "p", conn: conn, overall: overall, logger: zap.NewNop(),
			cfg: quota.Config{Prefix: "race:p", Replica: "r1", Limit: rate, Interval: interval, MaxPeers: 16}}
		if withMessage {
			m, err := ratelimit.NewRule("m", rate/2, 0)
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.cfg
			cfg.Prefix, cfg.Limit = s.cfg.Prefix+messageKeySep+"m", rate/2
			s.messages = []messageSpec{{cfg: cfg, rule: m}}
		}
		return s
	}
	c, err := newCluster(context.Background(), "race-edge", spec(100, 2*time.Millisecond, true))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				f(i)
			}
		}()
	}
	// Requests.
	run(func(i int) {
		now := time.Now().UnixNano()
		key := fmt.Sprint("peer", i%40)
		c.Allow(key, now)
		for _, mq := range c.messages() {
			if mq.Allow(key, now) {
				mq.Refund(key, now)
			}
		}
	})
	// The admin view.
	run(func(int) { _ = c.view(); time.Sleep(time.Millisecond) })
	// Dynamic throttling.
	run(func(i int) {
		c.spec.Load().overall.SetThrottle(i % 50)
		c.applyThrottle(time.Now())
		time.Sleep(time.Millisecond)
	})
	// Reloads: the kept quota, a new one; the message type removed and
	// added back.
	run(func(i int) {
		var err error
		switch i % 3 {
		case 0:
			err = c.update(spec(100, 2*time.Millisecond, true))
		case 1:
			err = c.update(spec(100, 3*time.Millisecond, false))
		default:
			err = c.update(spec(200, 2*time.Millisecond, true))
		}
		if err != nil {
			t.Error(err)
		}
		time.Sleep(3 * time.Millisecond)
	})
	time.Sleep(300 * time.Millisecond)
	cancel()
	wg.Wait()
	// The loop goes on syncing the last reload's quota.
	for deadline := time.Now().Add(10 * time.Second); c.q.Load().State().LastAttempt.IsZero(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sync loop attempted no sync of the current quota: %+v", c.q.Load().State())
		}
	}
	c.stop()
	client.Close()
	// go-redis' background dials of the refused address outlive Close by a
	// backoff; wait for them, so that they do not allocate during a later
	// test's allocation count (TestDiameterReadAllocatesNothing).
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("go-redis")); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("go-redis goroutines left 10 s after Close:\n%s", buf)
		}
	}
}

// A generation whose cluster settings cannot be applied changes nothing:
// the cluster keeps the spec and quotas it had, so the same settings
// arriving again (the next load) are applied in full, not taken as
// already in place.
func TestClusterUpdateFailureChangesNothing(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 10 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	conn := &redisstore.Conn{Name: "r", Client: client}
	rule := func(name string, rate float64) *ratelimit.Rule {
		r, err := ratelimit.NewRule(name, rate, 10)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	spec := func(limit, msgLimit float64) *clusterSpec {
		cfg := quota.Config{Prefix: "p", Replica: "r1", Limit: limit, Interval: time.Hour}
		m := cfg
		m.Prefix, m.Limit = "p/message/CCR", msgLimit
		return &clusterSpec{profile: "p", conn: conn, cfg: cfg, overall: rule("overall", limit), logger: zap.NewNop(),
			messages: []messageSpec{{cfg: m, rule: rule("CCR", 10)}}}
	}
	first := spec(100, 10)
	c, err := newCluster(context.Background(), "h", first)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	q, mq := c.q.Load(), (*c.msgs.Load())["CCR"].q.Load()

	if err := c.update(spec(200, 0)); err == nil { // a message limit of 0: quota.New refuses it
		t.Fatal("update with a message limit of 0 succeeded")
	}
	if c.spec.Load() != first || c.q.Load() != q || (*c.msgs.Load())["CCR"].q.Load() != mq {
		t.Fatal("a failed update changed the cluster's spec or quotas")
	}

	second := spec(200, 20)
	if err := c.update(second); err != nil {
		t.Fatal(err)
	}
	if c.spec.Load() != second || c.q.Load() == q || c.q.Load().Config().Limit != 200 {
		t.Fatalf("the settings after a failed update were not applied: limit %v", c.q.Load().Config().Limit)
	}
	if got := (*c.msgs.Load())["CCR"].q.Load(); got == mq || got.Config().Limit != 20 {
		t.Fatal("the message type's new settings were not applied")
	}
}
