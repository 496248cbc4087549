// Package quotaredis is the Redis store of the cluster-wide limit
// (internal/quota): a sync as one go-redis pipeline, the commands of
// quota's package comment, and the classification of its errors
// (internal/redisconn).
package quotaredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// Store runs a sync as one go-redis pipeline: exactly the commands of
// quota's package comment, in one round trip (a cluster client splits it per
// shard, in parallel). It only carries bytes; the engine validates them.
type Store struct {
	client redis.UniversalClient
}

// New returns a store over client (single server, Sentinel or Cluster:
// go-redis' universal client).
func New(client redis.UniversalClient) *Store { return &Store{client: client} }

// Sync runs the batch. A failed round trip (no command answered:
// connection refused, closed client, a timeout before any reply) is the
// error; every other error — a command's own error reply (WRONGTYPE,
// NOPERM, OOM, MOVED, …) or a timeout or reset that cut the pipeline
// after some commands answered — goes in the Answer, for the command it
// belongs to. The engine classifies them (Classify).
func (s *Store) Sync(ctx context.Context, b *quota.Batch) (*quota.Answer, error) {
	ans, err := s.SyncGroup(ctx, []*quota.Batch{b})
	if err != nil {
		return nil, err
	}
	return ans[0], nil
}

// SyncGroup runs the batches in one pipeline: one round trip.
func (s *Store) SyncGroup(ctx context.Context, bs []*quota.Batch) ([]*quota.Answer, error) {
	pipe := s.client.Pipeline()
	qs := make([]queued, len(bs))
	for j, b := range bs {
		qs[j] = queue(ctx, pipe, b)
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil && noneAnswered(cmds) {
		return nil, err
	}
	out := make([]*quota.Answer, len(bs))
	for j, b := range bs {
		out[j] = qs[j].answer(b)
	}
	return out, nil
}

// queued are the commands of one batch in the pipeline.
type queued struct {
	time      *redis.TimeCmd
	heartbeat []redis.Cmder
	card      *redis.IntCmd
	reserved  *redis.IntCmd
	counts    []counted
	reads     []*redis.SliceCmd
}

// counted are the commands of one peer's counts.
type counted struct {
	a, d, r *redis.IntCmd // r: nil unless the batch is Reserving
	x       *redis.BoolCmd
}

// queue adds b's commands to pipe, in the order of quota's package
// comment.
func queue(ctx context.Context, pipe redis.Pipeliner, b *quota.Batch) queued {
	var q queued
	if b.Time {
		q.time = pipe.Time(ctx)
	}
	for _, k := range b.Repair {
		pipe.Del(ctx, k)
	}
	if !b.NoHeartbeat {
		rk := quota.ReplicasKey(b.Prefix)
		cutoff := strconv.FormatInt(b.Now.UnixMilli()-b.ReplicaTTL.Milliseconds(), 10)
		add := pipe.ZAdd(ctx, rk, redis.Z{Score: float64(quota.HeartbeatScore(b.Now, b.Reserving)), Member: b.Replica})
		rem := pipe.ZRemRangeByScore(ctx, rk, "(-"+cutoff, "("+cutoff)
		q.card = pipe.ZCard(ctx, rk)
		q.reserved = pipe.ZCount(ctx, rk, "-inf", "("+strconv.FormatInt(b.Fresh.UnixMilli(), 10))
		q.heartbeat = []redis.Cmder{add, rem, q.card, q.reserved}
	}
	q.counts = make([]counted, len(b.Counts))
	for i, c := range b.Counts {
		k := quota.PeerKey(b.Prefix, c.Peer, b.Epoch)
		q.counts[i].a = pipe.HIncrBy(ctx, k, "a", clampInt(c.Admitted))
		q.counts[i].d = pipe.HIncrBy(ctx, k, "d", clampInt(c.Demanded))
		if b.Reserving && !c.Probe {
			q.counts[i].r = pipe.HIncrBy(ctx, k, "r", 1)
		}
		q.counts[i].x = pipe.PExpire(ctx, k, b.KeyTTL)
	}
	q.reads = make([]*redis.SliceCmd, len(b.Read))
	for i, p := range b.Read {
		q.reads[i] = pipe.HMGet(ctx, quota.PeerKey(b.Prefix, p, b.Epoch-1), "a", "d", "r")
	}
	return q
}

// answer reads the replies of b's commands, after the pipeline ran.
func (q *queued) answer(b *quota.Batch) *quota.Answer {
	ans := &quota.Answer{Totals: make([]quota.Raw, len(b.Read)), CountErrs: make([]error, len(b.Counts))}
	if q.time != nil {
		ans.Time, ans.TimeErr = q.time.Result()
	}
	for _, c := range q.heartbeat {
		if e := c.Err(); e != nil && ans.ReplicasErr == nil {
			ans.ReplicasErr = e
		}
	}
	if q.card != nil && ans.ReplicasErr == nil {
		ans.Replicas, ans.Reserved = q.card.Val(), q.reserved.Val()
	}
	for i, c := range q.counts {
		errs := []error{c.a.Err(), c.d.Err(), c.x.Err()}
		if c.r != nil {
			errs = append(errs, c.r.Err())
		}
		for _, e := range errs {
			if e != nil {
				ans.CountErrs[i] = e
				break
			}
		}
	}
	for i, cmd := range q.reads {
		vals, err := cmd.Result()
		if err != nil {
			ans.Totals[i].Err = err
			continue
		}
		if len(vals) != 3 {
			ans.Totals[i].Err = fmt.Errorf("%w: HMGET answered %d values for 3 fields", redisconn.ErrMalformed, len(vals))
			continue
		}
		t := &ans.Totals[i]
		for j, f := range []*[]byte{&t.Admitted, &t.Demanded, &t.Marked} {
			if *f, t.Err = field(vals[j]); t.Err != nil {
				break
			}
		}
	}
	return ans
}

// kinds maps redisconn's classification onto the engine's.
var kinds = map[redisconn.Kind]quota.ErrorKind{
	redisconn.OK:        quota.NoError,
	redisconn.NotFound:  quota.NotFound,
	redisconn.Malformed: quota.Malformed,
	redisconn.Trouble:   quota.StoreTrouble,
}

// Classify says what err means by redisconn.Classify, the one reading of
// a Redis error every module shares, and names store trouble by
// redisconn.Reason.
func (s *Store) Classify(err error) (quota.ErrorKind, string) {
	return kinds[redisconn.Classify(err)], redisconn.Reason(err)
}

// noneAnswered reports whether every command of a pipeline failed without
// an answer of the store's own (not an error reply): the round trip
// failed as a whole.
func noneAnswered(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		var re redis.Error
		if err := c.Err(); err == nil || errors.Is(err, redis.Nil) || (errors.As(err, &re) && !errors.Is(err, redis.ErrClosed)) {
			return false
		}
	}
	return true
}

func field(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []byte(v), nil
	default:
		return nil, fmt.Errorf("%w: HMGET field of type %T", redisconn.ErrMalformed, v)
	}
}

func clampInt(n uint64) int64 {
	if n > quota.MaxCount {
		return quota.MaxCount
	}
	return int64(n)
}
