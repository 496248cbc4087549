package diameteragent

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/olrshare"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// BindingStoreConfig shares the agent's Session-Id bindings with its other
// replicas through a Redis connection of the edgesteer_redis app.
type BindingStoreConfig struct {
	// Redis names the connection (the edgesteer_redis global option).
	Redis string `json:"redis"`
	// Timeout bounds the store read on a local miss of a request that
	// continues a session (default 50ms, at most 1s).
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Backlog bounds the writes waiting for the store (default 100000).
	Backlog int `json:"backlog,omitempty"`
}

// maxBindingStoreTimeout caps timeout: each local miss of a continuing
// request may wait that long while the store is slow but not yet down.
const maxBindingStoreTimeout = time.Second

// bindingStore parses
//
//	binding_store redis <name> {
//		timeout <duration>
//		backlog <n>
//	}
func (h *Handler) bindingStore(b *cfparse.Block) error {
	if err := b.Once(); err != nil {
		return err
	}
	args, err := b.BlockArgs(2, 2)
	if err != nil {
		return err
	}
	if args[0] != "redis" {
		return b.Invalid(args[0], fmt.Errorf("want redis <name>"))
	}
	bs := &BindingStoreConfig{Redis: args[1]}
	sub := b.Sub()
	for sub.Next() {
		switch sub.Name() {
		case "timeout":
			bs.Timeout, err = sub.Duration(time.Millisecond)
		case "backlog":
			bs.Backlog, err = sub.Int(1, math.MaxInt32)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return err
		}
	}
	h.BindingStore = bs
	return nil
}

// provisionBindingStore resolves binding_store to the engine's shared
// level: the named connection and the agent's key namespace,
// "<key_prefix>:diameter_agent:<agent name>".
func (h *Handler) provisionBindingStore(ctx caddy.Context) error {
	bs := h.BindingStore
	if bs == nil {
		return nil
	}
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("diameter_agent %s: binding_store %s %v: %s", h.Name, opt, v, why)
	}
	if bs.Redis == "" {
		return bad("redis", `""`, "name a store of edgesteer_redis")
	}
	if t := time.Duration(bs.Timeout); t < 0 || t > maxBindingStoreTimeout {
		return bad("timeout", t, "want 1ms to 1s (a local miss of a continuing request waits this long on a slow store)")
	}
	if bs.Backlog < 0 {
		return bad("backlog", bs.Backlog, "must be positive")
	}
	conn, err := redisstore.Lookup(ctx, "diameter_agent "+h.Name+": binding_store", bs.Redis)
	if err != nil {
		return err
	}
	if err := metricsreg.Register(ctx, bindingStoreCollector{}); err != nil {
		return err
	}
	h.store = &diambind.Config{Store: redisBindings{conn.Client}, Name: "redis " + bs.Redis,
		Prefix: conn.Key("diameter_agent", h.Name), Timeout: time.Duration(bs.Timeout), Backlog: bs.Backlog}
	if h.DOIC != nil {
		if err := metricsreg.Register(ctx, reportStoreCollector{}); err != nil {
			return err
		}
		h.reports = &olrshare.Config{Store: redisReports{c: conn.Client, key: conn.Key("diameter_agent_doic", h.Name)},
			Name: "redis " + bs.Redis}
	}
	return nil
}

// redisBindings is diambind.Store over go-redis.
type redisBindings struct{ c redis.UniversalClient }

func (r redisBindings) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	v, err := r.c.GetEx(ctx, key, ttl).Result()
	return v, bindingStoreErr(err)
}

// Apply sends ops in one pipeline. A Claim is SET NX then GETEX, so its
// result is the key's value after it (ours, or the first writer's) and
// its expiry is renewed either way.
func (r redisBindings) Apply(ctx context.Context, ops []diambind.Op, ttl time.Duration) []diambind.Result {
	cmds := make([]redis.Cmder, len(ops))
	_, _ = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, op := range ops {
			switch op.Kind {
			case diambind.Claim:
				p.SetNX(ctx, op.Key, op.Value, ttl)
				cmds[i] = p.GetEx(ctx, op.Key, ttl)
			case diambind.Move:
				cmds[i] = p.Set(ctx, op.Key, op.Value, ttl)
			default:
				cmds[i] = p.Del(ctx, op.Key)
			}
		}
		return nil
	})
	res := make([]diambind.Result, len(ops))
	for i, c := range cmds {
		res[i].Err = bindingStoreErr(c.Err())
		if s, ok := c.(*redis.StringCmd); ok && res[i].Err == nil {
			res[i].Value = s.Val()
		}
	}
	return res
}

func (r redisBindings) Ping(ctx context.Context) error { return bindingStoreErr(r.c.Ping(ctx).Err()) }

// bindingStoreErr says what a Redis error means to the engine, as
// redisconn classifies it for every module.
func bindingStoreErr(err error) error {
	switch redisconn.Classify(err) {
	case redisconn.OK:
		return nil
	case redisconn.NotFound:
		return diambind.ErrNotFound
	case redisconn.Malformed:
		return diambind.ErrMalformed
	}
	return &diambind.Trouble{Reason: redisconn.Reason(err), Answered: redisconn.IsReply(err), Err: err}
}

var _ diambind.Store = redisBindings{}

// bindingStoreCollector reads each live agent's shared level at scrape
// time.
type bindingStoreCollector struct{}

var (
	descStoreUp = prometheus.NewDesc(metricsPrefix+"binding_store_up",
		"1 while the agent's binding store is in use, 0 while it is marked down (bindings stay local).", []string{"agent", "store"}, nil)
	descStoreQueued = prometheus.NewDesc(metricsPrefix+"binding_store_queued",
		"Bindings made or ended here that wait to be written to the store.", []string{"agent", "store"}, nil)
	descStoreEvents = prometheus.NewDesc(metricsPrefix+"binding_store_events_total",
		"The binding store's counts by event: lookup, found, not_found, malformed, skipped (store down), error, written, ended, adopted, reconciled, dropped (backlog full), down.",
		[]string{"agent", "store", "event"}, nil)
)

func (bindingStoreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStoreUp
	ch <- descStoreQueued
	ch <- descStoreEvents
}

func (bindingStoreCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range liveAgents() {
		v := e.agent.BindingStoreView()
		if v == nil {
			continue
		}
		up := 0.0
		if v.Healthy {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, up, e.name, v.Store)
		ch <- prometheus.MustNewConstMetric(descStoreQueued, prometheus.GaugeValue, float64(v.Queued), e.name, v.Store)
		c := v.Counts
		for _, o := range []struct {
			event string
			n     int64
		}{{"lookup", c.Lookups}, {"found", c.Found}, {"not_found", c.NotFound}, {"malformed", c.Malformed},
			{"skipped", c.Skipped}, {"error", c.Errors}, {"written", c.Written}, {"ended", c.Ended},
			{"adopted", c.Adopted}, {"reconciled", c.Reconciled}, {"dropped", c.Dropped}, {"down", c.Downs}} {
			ch <- prometheus.MustNewConstMetric(descStoreEvents, prometheus.CounterValue, float64(o.n), e.name, v.Store, o.event)
		}
	}
}
