package ogs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// redisStore is the engine's shared cache level (ogs.Store) on Redis: a
// location's value at NS:LOCATION and its probe lock at NS:lock:{NS:LOCATION},
// where NS is key_prefix + ":ogs:" + the block's store name (its state
// name, or its served names). GetOrLock and Publish are Lua scripts, so
// each is one atomic step.
type redisStore struct {
	client  redis.UniversalClient
	release func() // the client's reference in redisconn's pool
	ns      string
}

func (r *redisStore) valueKey(location string) string { return r.ns + location }

// lockKey is NS:lock:{NS:LOCATION}: the braces make Redis Cluster hash only
// the value's key, so a location's value and lock share a slot and one
// script may touch both (a key with braces of its own keeps its own slot).
func (r *redisStore) lockKey(location string) string {
	v := r.valueKey(location)
	if strings.ContainsAny(v, "{}") {
		return r.ns + "lock:" + location
	}
	return r.ns + "lock:{" + v + "}"
}

// keyPattern is the pattern of the keys k names, for logs and the admin
// view.
func (r *redisStore) keyPattern(k gatewaysel.StoreKeys) string {
	switch k {
	case gatewaysel.KeysValue:
		return r.ns + "*"
	case gatewaysel.KeysLock:
		return r.ns + "lock:*"
	case gatewaysel.KeysBoth:
		return r.ns + "* (values and locks)"
	case gatewaysel.KeysReports:
		return r.reportsNS() + "*"
	case gatewaysel.KeysGeneration:
		return r.generationKey()
	}
	return "every key (the connection)"
}

// A value key of another type (another program's) is read as no value,
// and replaced by the next write: pcall catches WRONGTYPE, any other error
// is raised.
const readValue = `
local v = redis.pcall('GET', KEYS[1])
local bad = 0
if type(v) == 'table' and v.err then
  if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(v.err) end
  v, bad = false, 1
end
`

// getOrLock: KEYS value, lock; ARGV token, ttl ms, skip (or ""). Returns
// {0, value}, {1, bad} (locked) or {2, bad} (held by another).
var getOrLock = redis.NewScript(readValue + `
if v and v ~= ARGV[3] then return {0, v} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, bad} end
return {2, bad}`)

// publish: KEYS value, lock; ARGV token (or ""), value, ttl ms, skip (or
// ""). Returns {1} (written; the lock released if token held it) or {0,
// stored value} / {0}.
var publish = redis.NewScript(`
local lock = redis.call('GET', KEYS[2])
if ARGV[1] ~= '' and lock == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[2])
  return {1}
end
` + readValue + `
if not lock and (not v or v == ARGV[4]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return {1}
end
if v then return {0, v} end
return {0}`)

// extend and unlock act only for the lock's holder: a run that outlived
// its lock must not extend or release the next holder's.
var (
	extend = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end return 0`)
	unlock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
)

// generation: KEYS marker; ARGV token. The marker is set to token when
// there is none; it returns {marker, 1 if set}.
var generation = redis.NewScript(`
local set = redis.call('SET', KEYS[1], ARGV[1], 'NX')
return {redis.call('GET', KEYS[1]), set and 1 or 0}`)

// generationKey is NS:generation{H} (H: the hash reportsNS uses), the
// store's generation marker: a store restarted empty or flushed has none,
// or another (gatewaysel.GenerationStore).
func (r *redisStore) generationKey() string {
	ns := r.reportsNS() // NS + "reports{H}:"
	return r.ns + "generation" + strings.TrimSuffix(ns[len(r.ns)+len("reports"):], ":")
}

// Generation reads the generation marker, writing token where there is
// none (gatewaysel.GenerationStore).
func (r *redisStore) Generation(ctx context.Context, token string) (string, bool, error) {
	res, err := generation.Run(ctx, r.client, []string{r.generationKey()}, token).Slice()
	if err != nil {
		return "", false, r.trouble(ctx, "generation", err, "", gatewaysel.KeysGeneration)
	}
	if len(res) != 2 {
		return "", false, fmt.Errorf("generation: %d values in the answer", len(res))
	}
	gen, _ := res[0].(string)
	created, _ := res[1].(int64)
	return gen, created == 1, nil
}

func (r *redisStore) GetOrLock(ctx context.Context, location, token string, ttl time.Duration, skip []byte) (gatewaysel.Claim, error) {
	keys := []string{r.valueKey(location), r.lockKey(location)}
	res, err := getOrLock.Run(ctx, r.client, keys, token, ttl.Milliseconds(), string(skip)).Slice()
	if err != nil {
		return gatewaysel.Claim{}, r.trouble(ctx, "get_or_lock", err, location, gatewaysel.KeysBoth)
	}
	var c gatewaysel.Claim
	code, _ := res[0].(int64)
	switch {
	case code == 0 && len(res) == 2:
		v, _ := res[1].(string)
		c.Value = []byte(v)
	case code == 1:
		c.Locked = true
	}
	if code != 0 && len(res) == 2 && res[1] == int64(1) {
		c.Malformed = fmt.Errorf("%w: %s holds a key of another type", gatewaysel.ErrMalformed, keys[0])
	}
	return c, nil
}

func (r *redisStore) Extend(ctx context.Context, location, token string, ttl time.Duration) (bool, error) {
	n, err := extend.Run(ctx, r.client, []string{r.lockKey(location)}, token, ttl.Milliseconds()).Int64()
	if err != nil {
		return false, r.trouble(ctx, "extend", err, location, gatewaysel.KeysLock)
	}
	return n == 1, nil
}

func (r *redisStore) Publish(ctx context.Context, location, token string, value []byte, ttl time.Duration, skip []byte) ([]byte, bool, error) {
	keys := []string{r.valueKey(location), r.lockKey(location)}
	res, err := publish.Run(ctx, r.client, keys, token, string(value), ttl.Milliseconds(), string(skip)).Slice()
	if err != nil {
		return nil, false, r.trouble(ctx, "publish", err, location, gatewaysel.KeysBoth)
	}
	if code, _ := res[0].(int64); code == 1 {
		return nil, true, nil
	}
	if len(res) == 2 {
		v, _ := res[1].(string)
		return []byte(v), false, nil
	}
	return nil, false, nil
}

func (r *redisStore) Unlock(ctx context.Context, location, token string) error {
	if err := unlock.Run(ctx, r.client, []string{r.lockKey(location)}, token).Err(); err != nil {
		return r.trouble(ctx, "unlock", err, location, gatewaysel.KeysLock)
	}
	return nil
}

// trouble places err, the error of op on location's keys, through
// redisconn's one classifier: a value of another type is a malformed value
// (not store trouble); anything else is trouble, with its reason. Redis
// refuses a script whose declared keys an ACL user may not touch without
// saying which: then one EXISTS per key (cheap, and only on that error)
// tells which keys are refused.
func (r *redisStore) trouble(ctx context.Context, op string, err error, location string, keys gatewaysel.StoreKeys) error {
	if redisconn.Classify(err) == redisconn.Malformed {
		return fmt.Errorf("%w: %v", gatewaysel.ErrMalformed, err)
	}
	reason := redisconn.Reason(err)
	if reason == "" {
		reason = "other"
	}
	if keys == gatewaysel.KeysBoth && reason == "noperm" {
		refused := gatewaysel.StoreKeys(0)
		for k, key := range map[gatewaysel.StoreKeys]string{gatewaysel.KeysValue: r.valueKey(location), gatewaysel.KeysLock: r.lockKey(location)} {
			if e := r.client.Exists(ctx, key).Err(); redisconn.Reason(e) == "noperm" {
				refused |= k
			}
		}
		if refused != 0 {
			keys = refused
		}
	}
	if reason != "noperm" && reason != "error_reply" && reason != "oom" && reason != "readonly" {
		keys = gatewaysel.KeysAny // the store as a whole, not these keys
	}
	return &gatewaysel.StoreTrouble{Op: op, Keys: keys, Reason: reason, Err: err}
}

// onStore counts what happened with the store and logs its transitions
// (keys in trouble, answering again) once each.
func (o *OGS) onStore(ev gatewaysel.StoreEvent) {
	switch ev.Kind {
	case gatewaysel.StoreError:
		t := ev.Trouble
		storeErrors.WithLabelValues(t.Op, t.Keys.String(), t.Reason).Inc()
	case gatewaysel.StoreMalformed:
		storeMalformed.Inc()
		log.Warningf("store redis: value of location %s ignored: %v", ev.Location, ev.Err)
	case gatewaysel.StoreStale:
		storeStale.Inc()
	case gatewaysel.StoreLockWait:
		lockWaits.Inc()
	case gatewaysel.StoreAdopted:
		storeAdopted.Inc()
	case gatewaysel.StoreDown:
		t := ev.Trouble
		fallback := "probing locally"
		if t.Op == "put_reports" || t.Op == "sync_reports" {
			fallback = "answering from this replica's reports (writing them again then)"
		}
		log.Warningf("store redis %s: %s failed on %s (%s, location %s): %v; %s until it answers again",
			strings.Join(o.redis.Addresses, ","), t.Op, o.store.keyPattern(t.Keys), t.Reason, ev.Location, errors.Unwrap(t), fallback)
	case gatewaysel.StoreUp:
		log.Infof("store redis %s: answering again on %s", strings.Join(o.redis.Addresses, ","), o.store.keyPattern(ev.Trouble.Keys))
	}
}
