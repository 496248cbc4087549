package quota

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RedisStore runs a sync as one go-redis pipeline: exactly the commands of
// the package comment, in one round trip (a cluster client splits it per
// shard, in parallel). It only carries bytes; the engine validates them.
type RedisStore struct {
	client redis.UniversalClient
}

// NewRedisStore returns a store over client (single server, Sentinel or
// Cluster: go-redis' universal client).
func NewRedisStore(client redis.UniversalClient) *RedisStore { return &RedisStore{client: client} }

// Sync runs the batch. A failed round trip (connection refused, timeout,
// closed client) is the error; a command's own error reply (WRONGTYPE on
// another program's key, a non-integer field) goes in the Answer.
func (s *RedisStore) Sync(ctx context.Context, b *Batch) (*Answer, error) {
	ans, err := s.SyncGroup(ctx, []*Batch{b})
	if err != nil {
		return nil, err
	}
	return ans[0], nil
}

// SyncGroup runs the batches in one pipeline: one round trip.
func (s *RedisStore) SyncGroup(ctx context.Context, bs []*Batch) ([]*Answer, error) {
	pipe := s.client.Pipeline()
	type counted struct {
		a, d *redis.IntCmd
		x    *redis.BoolCmd
	}
	type queued struct {
		zadd   *redis.IntCmd
		card   *redis.IntCmd
		counts []counted
		reads  []*redis.SliceCmd
	}
	qs := make([]queued, len(bs))
	for j, b := range bs {
		q := &qs[j]
		if !b.NoHeartbeat {
			rk := ReplicasKey(b.Prefix)
			nowMs := b.Now.UnixMilli()
			cutoff := nowMs - b.ReplicaTTL.Milliseconds()
			q.zadd = pipe.ZAdd(ctx, rk, redis.Z{Score: float64(nowMs), Member: b.Replica})
			pipe.ZRemRangeByScore(ctx, rk, "-inf", "("+strconv.FormatInt(cutoff, 10))
			q.card = pipe.ZCard(ctx, rk)
		}
		q.counts = make([]counted, len(b.Counts))
		for i, c := range b.Counts {
			k := PeerKey(b.Prefix, c.Peer, b.Epoch)
			q.counts[i] = counted{
				a: pipe.HIncrBy(ctx, k, "a", clampInt(c.Admitted)),
				d: pipe.HIncrBy(ctx, k, "d", clampInt(c.Demanded)),
				x: pipe.PExpire(ctx, k, b.KeyTTL),
			}
		}
		q.reads = make([]*redis.SliceCmd, len(b.Read))
		for i, p := range b.Read {
			q.reads[i] = pipe.HMGet(ctx, PeerKey(b.Prefix, p, b.Epoch-1), "a", "d")
		}
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !isReply(err) {
		return nil, err
	}
	out := make([]*Answer, len(bs))
	for j, b := range bs {
		q := &qs[j]
		// A server that refuses the heartbeat for another reason than
		// another program's key of the wrong type (LOADING after a
		// restart, NOAUTH, READONLY, OOM) cannot be used: that is the
		// store down, not a value to ignore.
		if q.zadd != nil {
			if err := q.zadd.Err(); err != nil && !strings.HasPrefix(err.Error(), "WRONGTYPE") {
				return nil, err
			}
		}
		ans := &Answer{Totals: make([]Raw, len(b.Read)), CountErrs: make([]error, len(b.Counts))}
		if q.card != nil {
			ans.Replicas, ans.ReplicasErr = q.card.Result()
		}
		for i, c := range q.counts {
			for _, e := range []error{c.a.Err(), c.d.Err(), c.x.Err()} {
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
			if len(vals) != 2 {
				ans.Totals[i].Err = errors.New("HMGET answered " + strconv.Itoa(len(vals)) + " values for 2 fields")
				continue
			}
			ans.Totals[i].Admitted, ans.Totals[i].Err = field(vals[0])
			if ans.Totals[i].Err == nil {
				ans.Totals[i].Demanded, ans.Totals[i].Err = field(vals[1])
			}
		}
		out[j] = ans
	}
	return out, nil
}

// isReply reports whether err is an error reply of Redis to one command
// (the round trip itself worked), not a failed round trip.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.ErrClosed)
}

func field(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []byte(v), nil
	default:
		return nil, errors.New("HMGET field of an unexpected type")
	}
}

func clampInt(n uint64) int64 {
	if n > maxCount {
		return maxCount
	}
	return int64(n)
}
