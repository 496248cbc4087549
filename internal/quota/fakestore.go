package quota

import (
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FakeStore is an in-memory store with Redis' semantics for the commands
// a sync uses (see the package comment): typed keys (WRONGTYPE on a
// mismatch), integer hash fields (HINCRBY fails on a non-integer), expiry
// by its own clock, values as bytes. It counts commands, round trips and
// RESP bytes both ways. For tests and the simulation; safe for concurrent
// use.
type FakeStore struct {
	// Now is the store's clock (default: the wall clock).
	Now func() time.Time

	mu        sync.Mutex
	down      error
	deny      func(key string) error
	denyWrite func(key string) error
	keys      map[string]*fakeKey
	lastPurge time.Time
	stats     FakeStats
}

// FakeStats counts the store's traffic.
type FakeStats struct {
	RoundTrips, Commands int64
	BytesIn, BytesOut    int64 // requests to, replies from the store (RESP)
}

type fakeKey struct {
	expires time.Time // zero: no expiry
	str     []byte
	hash    map[string][]byte
	zset    map[string]float64
}

// Reply is an error reply of the store, as Redis sends one: Classify
// reads it by its first word.
type Reply string

func (r Reply) Error() string { return string(r) }

var (
	errWrongType = Reply("WRONGTYPE Operation against a key holding the wrong kind of value")
	errNotInt    = Reply("ERR hash value is not an integer")
)

// Classify reads a Reply by its first word, as the Redis store does:
// WRONGTYPE and a field that is not an integer are Malformed, every other
// reply is StoreTrouble named by its first word in lower case (NOPERM:
// "noperm"). Any other error (SetDown's, SetDeny's) is StoreTrouble,
// named as the Redis store names a connection's: a deadline "timeout", a
// reset "reset", a refused dial "refused", anything else "other".
func (s *FakeStore) Classify(err error) (ErrorKind, string) {
	var r Reply
	switch {
	case err == nil:
		return NoError, ""
	case errors.As(err, &r):
		word, _, _ := strings.Cut(string(r), " ")
		if word == "WRONGTYPE" || r == errNotInt {
			return Malformed, ""
		}
		return StoreTrouble, strings.ToLower(word)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return StoreTrouble, "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return StoreTrouble, "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return StoreTrouble, "refused"
	}
	return StoreTrouble, "other"
}

// NewFakeStore returns an empty store.
func NewFakeStore() *FakeStore {
	return &FakeStore{keys: map[string]*fakeKey{}, Now: time.Now}
}

// SetDown makes every round trip fail with err (nil: up again).
func (s *FakeStore) SetDown(err error) {
	s.mu.Lock()
	s.down = err
	s.mu.Unlock()
}

// SetDeny makes every command on a key for which deny returns an error
// fail with it (an ACL user allowed only part of the key space: deny
// returns Reply("NOPERM …"); a Cluster shard down: Reply("CLUSTERDOWN …")).
// nil: every key allowed.
func (s *FakeStore) SetDeny(deny func(key string) error) {
	s.mu.Lock()
	s.deny = deny
	s.mu.Unlock()
}

// SetDenyWrite is SetDeny for the writes alone (HINCRBY, PEXPIRE): an
// ACL user allowed to read part of the key space but not write it
// (%R~pattern).
func (s *FakeStore) SetDenyWrite(deny func(key string) error) {
	s.mu.Lock()
	s.denyWrite = deny
	s.mu.Unlock()
}

func (s *FakeStore) denied(key string) error {
	if s.deny == nil {
		return nil
	}
	return s.deny(key)
}

// Stats returns the traffic so far.
func (s *FakeStore) Stats() FakeStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Set stores a string value (another program's key, in tests).
func (s *FakeStore) Set(key string, value []byte) {
	s.mu.Lock()
	s.keys[key] = &fakeKey{str: value}
	s.mu.Unlock()
}

// HSet sets a hash field, as HSET does (WRONGTYPE on another type).
func (s *FakeStore) HSet(key, field string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.get(key, s.Now(), kindHash)
	if err != nil {
		return err
	}
	if k == nil {
		k = &fakeKey{hash: map[string][]byte{}}
		s.keys[key] = k
	}
	k.hash[field] = value
	return nil
}

// Keys returns the number of live keys.
func (s *FakeStore) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, n := s.Now(), 0
	for _, k := range s.keys {
		if k.expires.IsZero() || now.Before(k.expires) {
			n++
		}
	}
	return n
}

type kind int

const (
	kindHash kind = iota
	kindZset
)

// get returns the live key or nil, or WRONGTYPE (lazy expiry, as Redis).
func (s *FakeStore) get(key string, now time.Time, want kind) (*fakeKey, error) {
	k := s.keys[key]
	if k == nil {
		return nil, nil
	}
	if !k.expires.IsZero() && !now.Before(k.expires) {
		delete(s.keys, key)
		return nil, nil
	}
	if (want == kindHash && k.hash == nil) || (want == kindZset && k.zset == nil) {
		return nil, errWrongType
	}
	return k, nil
}

// RESP sizes: an array of bulk strings, an integer reply.
func respCmd(args ...string) int64 {
	n := int64(1 + len(strconv.Itoa(len(args))) + 2)
	for _, a := range args {
		n += int64(1+len(strconv.Itoa(len(a)))+2) + int64(len(a)) + 2
	}
	return n
}

func respInt(v int64) int64 { return int64(1 + len(strconv.FormatInt(v, 10)) + 2) }

func respBulk(b []byte) int64 {
	if b == nil {
		return 5 // $-1\r\n
	}
	return int64(1+len(strconv.Itoa(len(b)))+2) + int64(len(b)) + 2
}

const respErr = 40 // about the size of an error reply

func (s *FakeStore) cmd(args ...string) { s.stats.Commands++; s.stats.BytesIn += respCmd(args...) }

// Sync runs a batch as the pipeline in the package comment would.
func (s *FakeStore) Sync(ctx context.Context, b *Batch) (*Answer, error) {
	ans, err := s.SyncGroup(ctx, []*Batch{b})
	if err != nil {
		return nil, err
	}
	return ans[0], nil
}

// SyncGroup runs the batches as one pipeline: one round trip.
func (s *FakeStore) SyncGroup(ctx context.Context, bs []*Batch) ([]*Answer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	now := s.Now()
	s.stats.RoundTrips++
	out := make([]*Answer, len(bs))
	for i, b := range bs {
		s.purge(now, b.KeyTTL)
		out[i] = s.batch(now, b)
	}
	return out, nil
}

func (s *FakeStore) batch(now time.Time, b *Batch) *Answer {
	ans := &Answer{Totals: make([]Raw, len(b.Read)), CountErrs: make([]error, len(b.Counts))}
	if b.Time {
		s.cmd("TIME")
		s.stats.BytesOut += 2*respBulk([]byte("1700000000")) + 4
		ans.Time = now
	}
	for _, k := range b.Repair {
		s.cmd("DEL", k)
		s.stats.BytesOut += respInt(1)
		if s.denied(k) == nil {
			delete(s.keys, k)
		}
	}
	if !b.NoHeartbeat {
		s.heartbeat(now, b, ans)
	}
	s.counts(now, b, ans)
	return ans
}

// heartbeat: ZADD, ZREMRANGEBYSCORE, ZCARD, ZCOUNT.
func (s *FakeStore) heartbeat(now time.Time, b *Batch, ans *Answer) {
	rk := ReplicasKey(b.Prefix)
	score := float64(HeartbeatScore(b.Now, b.Reserving))
	cutoff := float64(b.Now.UnixMilli() - b.ReplicaTTL.Milliseconds())
	fresh := float64(b.Fresh.UnixMilli())
	s.cmd("ZADD", rk, strconv.FormatFloat(score, 'f', -1, 64), b.Replica)
	s.cmd("ZREMRANGEBYSCORE", rk, "(-"+strconv.FormatFloat(cutoff, 'f', -1, 64), "("+strconv.FormatFloat(cutoff, 'f', -1, 64))
	s.cmd("ZCARD", rk)
	s.cmd("ZCOUNT", rk, "-inf", "("+strconv.FormatFloat(fresh, 'f', -1, 64))
	k, err := s.get(rk, now, kindZset)
	if d := s.denied(rk); d != nil {
		err = d
	}
	if err == nil {
		if k == nil {
			k = &fakeKey{zset: map[string]float64{}}
			s.keys[rk] = k
		}
		k.zset[b.Replica] = score
		removed := 0
		for m, sc := range k.zset {
			if sc > -cutoff && sc < cutoff {
				delete(k.zset, m)
				removed++
			}
		}
		for _, sc := range k.zset {
			if sc < fresh {
				ans.Reserved++
			}
		}
		ans.Replicas = int64(len(k.zset))
		s.stats.BytesOut += respInt(1) + respInt(int64(removed)) + respInt(ans.Replicas) + respInt(ans.Reserved)
	} else {
		ans.ReplicasErr = err
		s.stats.BytesOut += 4 * respErr
	}
}

func (s *FakeStore) counts(now time.Time, b *Batch, ans *Answer) {
	ttl := strconv.FormatInt(b.KeyTTL.Milliseconds(), 10)
	for i, c := range b.Counts {
		key := PeerKey(b.Prefix, c.Peer, b.Epoch)
		an, dn := strconv.FormatUint(c.Admitted, 10), strconv.FormatUint(c.Demanded, 10)
		s.cmd("HINCRBY", key, "a", an)
		s.cmd("HINCRBY", key, "d", dn)
		marked := uint64(0)
		if b.Reserving && !c.Probe {
			s.cmd("HINCRBY", key, "r", "1")
			marked = 1
		}
		s.cmd("PEXPIRE", key, ttl)
		d := s.denied(key)
		if d == nil && s.denyWrite != nil {
			d = s.denyWrite(key)
		}
		if d != nil {
			ans.CountErrs[i] = d
			s.stats.BytesOut += 3 * respErr
			continue
		}
		ans.CountErrs[i] = s.hincr(key, now, c.Admitted, c.Demanded, marked, b.KeyTTL)
	}
	for i, p := range b.Read {
		key := PeerKey(b.Prefix, p, b.Epoch-1)
		s.cmd("HMGET", key, "a", "d", "r")
		k, err := s.get(key, now, kindHash)
		if d := s.denied(key); d != nil {
			err = d
		}
		switch {
		case err != nil:
			ans.Totals[i].Err = err
			s.stats.BytesOut += respErr
		case k == nil:
			s.stats.BytesOut += 4 + 3*respBulk(nil)
		default:
			a, d, r := k.hash["a"], k.hash["d"], k.hash["r"]
			ans.Totals[i] = Raw{Admitted: clone(a), Demanded: clone(d), Marked: clone(r)}
			s.stats.BytesOut += 4 + respBulk(a) + respBulk(d) + respBulk(r)
		}
	}
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

// hincr does HINCRBY a, HINCRBY d, HINCRBY r (when r > 0), PEXPIRE on
// one key, counting the replies; it returns the first error.
func (s *FakeStore) hincr(key string, now time.Time, a, d, r uint64, ttl time.Duration) error {
	k, err := s.get(key, now, kindHash)
	if err != nil {
		s.stats.BytesOut += 2*respErr + respInt(1)
		return err
	}
	if k == nil {
		k = &fakeKey{hash: map[string][]byte{}}
		s.keys[key] = k
	}
	var first error
	for _, f := range []struct {
		name string
		by   uint64
	}{{"a", a}, {"d", d}, {"r", r}} {
		if f.name == "r" && r == 0 {
			continue
		}
		old := int64(0)
		if v, ok := k.hash[f.name]; ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				s.stats.BytesOut += respErr
				first = firstErr(first, errNotInt)
				continue
			}
			old = n
		}
		if f.by > math.MaxInt64 || old > math.MaxInt64-int64(f.by) {
			s.stats.BytesOut += respErr
			first = firstErr(first, Reply("ERR increment or decrement would overflow"))
			continue
		}
		nv := old + int64(f.by)
		k.hash[f.name] = []byte(strconv.FormatInt(nv, 10))
		s.stats.BytesOut += respInt(nv)
	}
	k.expires = now.Add(ttl)
	s.stats.BytesOut += respInt(1)
	return first
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// purge drops expired keys now and then, as Redis' active expiry does
// (only for memory: every read already checks expiry).
func (s *FakeStore) purge(now time.Time, every time.Duration) {
	if now.Sub(s.lastPurge) < every {
		return
	}
	s.lastPurge = now
	for key, k := range s.keys {
		if !k.expires.IsZero() && !now.Before(k.expires) {
			delete(s.keys, key)
		}
	}
}
