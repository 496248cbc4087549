package ogs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/ogs"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// redisStore is the engine's shared cache level (ogs.Store) on Redis: a
// location's value at NS:LOCATION and its probe lock at NS:lock:LOCATION,
// where NS is key_prefix + ":ogs:" + the block's store name (its state
// name, or its served names).
type redisStore struct {
	client redis.UniversalClient
	ns     string
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

// clients holds one go-redis client per distinct connection config, shared
// by the ogs blocks that name it and handed over across reloads (the new
// configuration takes its reference before the old one lets go), so a
// reload does not drop Redis connections.
var clients = struct {
	sync.Mutex
	m map[string]*sharedClient
}{m: map[string]*sharedClient{}}

type sharedClient struct {
	client redis.UniversalClient
	refs   int
}

// clientKey identifies a connection config.
func clientKey(cfg *redisconn.Config) string {
	b, _ := json.Marshal(cfg)
	return string(b)
}

func acquireClient(cfg *redisconn.Config) (redis.UniversalClient, error) {
	clients.Lock()
	defer clients.Unlock()
	key := clientKey(cfg)
	if c := clients.m[key]; c != nil {
		c.refs++
		return c.client, nil
	}
	client, err := redisconn.New(cfg)
	if err != nil {
		return nil, err
	}
	clients.m[key] = &sharedClient{client: client, refs: 1}
	return client, nil
}

func releaseClient(cfg *redisconn.Config) {
	clients.Lock()
	defer clients.Unlock()
	key := clientKey(cfg)
	c := clients.m[key]
	if c == nil {
		return
	}
	if c.refs--; c.refs == 0 {
		delete(clients.m, key)
		c.client.Close()
	}
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
