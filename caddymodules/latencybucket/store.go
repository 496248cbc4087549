package latencybucket

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/pubsel"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// stickyStoreConfig resolves sticky_store to the engine's shared level: the
// named edgesteer_redis connection and this policy's key namespace,
// "<key_prefix>:latency_bucket:<policy name>".
func (c *Config) stickyStoreConfig(ctx caddy.Context, policy string) (*pubsel.StickyStoreConfig, error) {
	ss := c.StickyStore
	if ss == nil {
		return nil, nil
	}
	conn, err := redisstore.Lookup(ctx, "latency_bucket: sticky_store", ss.Redis)
	if err != nil {
		return nil, err
	}
	return &pubsel.StickyStoreConfig{
		Store:   redisStore{conn.Client},
		Name:    "redis " + ss.Redis,
		Prefix:  conn.Key("latency_bucket", policy),
		Timeout: time.Duration(ss.Timeout),
	}, nil
}

// redisStore is pubsel.Store over go-redis. It is comparable (a reload
// with the same connection keeps the engine's shared level).
type redisStore struct{ c redis.UniversalClient }

func (r redisStore) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	v, err := r.c.GetEx(ctx, key, ttl).Result()
	return v, storeErr(err)
}

func (r redisStore) SetNX(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	ok, err := r.c.SetNX(ctx, key, value, ttl).Result()
	return ok, storeErr(err)
}

func (r redisStore) Set(ctx context.Context, key, value string, ttl time.Duration) error {
	return storeErr(r.c.Set(ctx, key, value, ttl).Err())
}

func (r redisStore) Ping(ctx context.Context) error { return storeErr(r.c.Ping(ctx).Err()) }

// storeErr says what a Redis error means to the engine, as redisconn
// classifies it for every module: no key, a value of another type
// (malformed), or store trouble with its reason; trouble that is an error
// reply (the store answered: NOPERM, READONLY, OOM…) is told apart from
// trouble without an answer (a timeout, a refused or reset connection),
// which alone can mark the store unreachable.
func storeErr(err error) error {
	switch redisconn.Classify(err) {
	case redisconn.OK:
		return nil
	case redisconn.NotFound:
		return pubsel.ErrNotFound
	case redisconn.Malformed:
		return pubsel.ErrWrongType
	}
	return &pubsel.StoreError{Reason: redisconn.Reason(err), Answered: redisconn.IsReply(err), Err: err}
}

var _ pubsel.Store = redisStore{}
