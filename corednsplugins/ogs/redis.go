package ogs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/ogs"
)

// redisStore is the engine's shared cache level (ogs.Store) on Redis: a
// location's value at NS:LOCATION and its probe lock at NS:lock:LOCATION,
// where NS is key_prefix + ":ogs:" + the block's store name (its state
// name, or its served names).
type redisStore struct {
	client  redis.UniversalClient
	release func() // the client's reference in redisconn's pool
	ns      string
}

func (r *redisStore) Get(ctx context.Context, location string) ([]byte, error) {
	b, err := r.client.Get(ctx, r.ns+location).Bytes()
	var reply redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "WRONGTYPE"):
		// Another program's key of another type: a bad value, not a
		// Redis that is down (SET replaces it after this replica's run).
		return nil, fmt.Errorf("%w: %v", ogs.ErrMalformed, err)
	}
	return b, err
}

func (r *redisStore) Set(ctx context.Context, location string, value []byte, ttl time.Duration) error {
	return r.client.Set(ctx, r.ns+location, value, ttl).Err()
}

func (r *redisStore) Lock(ctx context.Context, location, token string, ttl time.Duration) (bool, error) {
	return r.client.SetNX(ctx, r.ns+"lock:"+location, token, ttl).Result()
}

// unlock deletes the lock only if its holder is still the caller: a run
// that outlived its lock must not release the next holder's.
var unlock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

func (r *redisStore) Unlock(ctx context.Context, location, token string) error {
	return unlock.Run(ctx, r.client, []string{r.ns + "lock:" + location}, token).Err()
}

// onStore counts what happened with the store and logs its transitions
// (down, answering again) once each.
func (o *OGS) onStore(ev ogs.StoreEvent) {
	switch ev.Kind {
	case ogs.StoreError:
		storeErrors.Inc()
	case ogs.StoreMalformed:
		storeMalformed.Inc()
		log.Warningf("store redis: value of location %s ignored: %v", ev.Location, ev.Err)
	case ogs.StoreStale:
		storeStale.Inc()
	case ogs.StoreLockWait:
		lockWaits.Inc()
	case ogs.StoreDown:
		log.Warningf("store redis %s: %v; probing locally until it answers again", strings.Join(o.redis.Addresses, ","), ev.Err)
	case ogs.StoreUp:
		log.Infof("store redis %s: answering again", strings.Join(o.redis.Addresses, ","))
	}
}
