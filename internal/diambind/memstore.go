package diambind

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"
)

// MemStore is a Store in memory, shared by the agents of a test as Redis
// is by replicas. Down makes every call fail as a Redis that refuses
// connections does, Hang as one that accepts them and never answers (each
// call returns at its context's deadline); Gets counts the reads. Expiry is kept but not
// enforced (tests read it).
type MemStore struct {
	mu     sync.Mutex
	m      map[string]string
	expiry map[string]time.Duration
	down   bool
	hang   chan struct{} // closed when the hang ends; nil: none
	gets   int
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{m: map[string]string{}, expiry: map[string]time.Duration{}}
}

var errRefused = &Trouble{Reason: "refused", Err: syscall.ECONNREFUSED}

// SetDown makes the store fail every call (true) or answer again.
func (s *MemStore) SetDown(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

// SetHang makes every call wait for its context's end (true), or ends
// the hang.
func (s *MemStore) SetHang(hang bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case hang && s.hang == nil:
		s.hang = make(chan struct{})
	case !hang && s.hang != nil:
		close(s.hang)
		s.hang = nil
	}
}

// wait blocks while the store hangs: ctx's error, or nil once it ends.
func (s *MemStore) wait(ctx context.Context) error {
	s.mu.Lock()
	h := s.hang
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h:
		return nil
	}
}

// Gets is the number of reads (Get) asked so far.
func (s *MemStore) Gets() int { s.mu.Lock(); defer s.mu.Unlock(); return s.gets }

// Value returns key's value as stored.
func (s *MemStore) Value(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	return v, ok
}

// Put sets key, as another program or replica would.
func (s *MemStore) Put(key, value string) { s.mu.Lock(); s.m[key] = value; s.mu.Unlock() }

// Len is the number of keys.
func (s *MemStore) Len() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.m) }

func (s *MemStore) Get(ctx context.Context, key string, ttl time.Duration) (string, error) {
	s.mu.Lock()
	s.gets++
	s.mu.Unlock()
	if err := s.wait(ctx); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return "", errRefused
	}
	v, ok := s.m[key]
	if !ok {
		return "", ErrNotFound
	}
	s.expiry[key] = ttl
	return v, nil
}

func (s *MemStore) Apply(ctx context.Context, ops []Op, ttl time.Duration) []Result {
	res := make([]Result, len(ops))
	if err := s.wait(ctx); err != nil {
		for i := range res {
			res[i].Err = err
		}
		return res
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, op := range ops {
		if s.down {
			res[i].Err = errRefused
			continue
		}
		switch op.Kind {
		case Claim:
			if _, ok := s.m[op.Key]; !ok {
				s.m[op.Key] = op.Value
			}
			s.expiry[op.Key] = ttl
			res[i].Value = s.m[op.Key]
		case Move:
			s.m[op.Key], s.expiry[op.Key] = op.Value, ttl
		case End:
			delete(s.m, op.Key)
			delete(s.expiry, op.Key)
		default:
			res[i].Err = errors.New("unknown op")
		}
	}
	return res
}

func (s *MemStore) Ping(ctx context.Context) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errRefused
	}
	return nil
}

var _ Store = (*MemStore)(nil)
