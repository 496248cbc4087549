package peerratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

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
