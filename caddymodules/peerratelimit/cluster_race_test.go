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
)

// The cluster's concurrent parts in process, for the race detector (make
// test runs the adapters under -race -short, which skips every bin/caddy
// test): the sync loop (failing syncs against an address where nothing
// listens: logTrouble, metrics), requests deciding through Allow and a
// message type's quota, the admin view, throttle changes and reloads
// (update: a kept quota and a new one, a message type added and removed),
// all at once; then stop.
func TestClusterConcurrentPartsUnderRace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every sync is refused at once
	client := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 20 * time.Millisecond, MaxRetries: -1})
	defer client.Close()
	conn := &redisstore.Conn{Name: "main", Client: client}
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
