package olrshare

import (
	"context"
	"sync"
	"syscall"
	"time"
)

// MemStore is a Store in memory with its own clock, shared by the agents
// of a test as Redis is by replicas; it follows the rule Store states, as
// the Redis adapter's script does. SetDown makes every call fail as a Redis
// that refuses connections.
type MemStore struct {
	mu    sync.Mutex
	now   func() time.Time
	m     map[key]memEntry
	down  bool
	reads int
}

type memEntry struct {
	seq       uint64
	reduction uint32
	expires   time.Time
}

// NewMemStore returns an empty store keeping time by now.
func NewMemStore(now func() time.Time) *MemStore { return &MemStore{now: now, m: map[key]memEntry{}} }

var errRefused = &Trouble{Reason: "refused", Err: syscall.ECONNREFUSED}

// SetDown makes the store fail every call (true) or answer again.
func (s *MemStore) SetDown(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

// Reads is the number of reads answered.
func (s *MemStore) Reads() int { s.mu.Lock(); defer s.mu.Unlock(); return s.reads }

func (s *MemStore) Offer(_ context.Context, entries []Entry) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(entries))
	now := s.now()
	for i, e := range entries {
		if s.down {
			errs[i] = errRefused
			continue
		}
		k := key{e.Type, e.Name}
		cur, ok := s.m[k]
		inForce := ok && now.Before(cur.expires)
		switch {
		case inForce && cur.seq >= e.Seq:
		case e.Reduction == 0 && inForce: // ends it: kept until it would have expired
			s.m[k] = memEntry{seq: e.Seq, expires: cur.expires}
		case e.Reduction == 0:
		default:
			s.m[k] = memEntry{seq: e.Seq, reduction: e.Reduction, expires: now.Add(e.Remaining)}
		}
	}
	return errs
}

func (s *MemStore) Read(context.Context) ([]Entry, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, 0, errRefused
	}
	s.reads++
	now := s.now()
	var out []Entry
	for k, e := range s.m {
		if !now.Before(e.expires) {
			delete(s.m, k)
			continue
		}
		out = append(out, Entry{Type: k.typ, Name: k.name, Seq: e.seq, Reduction: e.reduction, Remaining: e.expires.Sub(now)})
	}
	return out, 0, nil
}

func (s *MemStore) Ping(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errRefused
	}
	return nil
}

var _ Store = (*MemStore)(nil)
