package placement

import (
	"container/list"
	"sync"
)

// Recent is a bounded set of names that keeps the most recently touched
// ones: once it holds max names, touching a new one forgets the least
// recently touched. A router uses it for the tenants it has seen, whose
// names come from clients, so the set can never grow past max.
type Recent struct {
	mu    sync.Mutex
	max   int
	order list.List // front: most recent; values are names
	at    map[string]*list.Element
}

// NewRecent returns a set that holds at most limit names (at least 1).
func NewRecent(limit int) *Recent {
	return &Recent{max: max(1, limit), at: map[string]*list.Element{}}
}

// Touch adds name, or marks it most recent if it is there.
func (r *Recent) Touch(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.at[name]; ok {
		r.order.MoveToFront(e)
		return
	}
	if r.order.Len() >= r.max {
		oldest := r.order.Back()
		delete(r.at, oldest.Value.(string))
		r.order.Remove(oldest)
	}
	r.at[name] = r.order.PushFront(name)
}

// Names returns the names held, most recent first.
func (r *Recent) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, r.order.Len())
	for e := r.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(string))
	}
	return out
}

// Len returns how many names are held.
func (r *Recent) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.order.Len()
}
