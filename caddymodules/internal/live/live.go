// Package live keeps the live instances of a module (between Provision
// and Cleanup), so that its admin endpoint and metrics collector can list
// them across config reloads.
package live

import (
	"cmp"
	"slices"
	"sync"
)

// Set is a concurrency-safe set of live instances.
type Set[T comparable] struct {
	mu    sync.Mutex
	items map[T]struct{}
}

// Add registers an instance.
func (s *Set[T]) Add(v T) {
	s.mu.Lock()
	if s.items == nil {
		s.items = map[T]struct{}{}
	}
	s.items[v] = struct{}{}
	s.mu.Unlock()
}

// Remove unregisters an instance.
func (s *Set[T]) Remove(v T) {
	s.mu.Lock()
	delete(s.items, v)
	s.mu.Unlock()
}

// List returns the instances ordered by name.
func (s *Set[T]) List(name func(T) string) []T {
	s.mu.Lock()
	out := make([]T, 0, len(s.items))
	for v := range s.items {
		out = append(out, v)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b T) int { return cmp.Compare(name(a), name(b)) })
	return out
}
