package placement

import (
	"container/list"
	"maps"
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

// Touch adds name, or marks it most recent if it is there. It returns the
// name it forgot to make room, if any.
func (r *Recent) Touch(name string) (forgot string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.at[name]; ok {
		r.order.MoveToFront(e)
		return "", false
	}
	if r.order.Len() >= r.max {
		oldest := r.order.Back()
		forgot, ok = oldest.Value.(string), true
		delete(r.at, forgot)
		r.order.Remove(oldest)
	}
	r.at[name] = r.order.PushFront(name)
	return forgot, ok
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

// Tally counts events per name for a bounded set of names: once it holds
// max names, a new one forgets the least recently counted. A router uses
// it for failed binds per tenant, whose names come from clients.
type Tally struct {
	names *Recent
	mu    sync.Mutex
	n     map[string]uint64
}

// NewTally returns a tally of at most limit names.
func NewTally(limit int) *Tally {
	return &Tally{names: NewRecent(limit), n: map[string]uint64{}}
}

// Add counts one event for name.
func (t *Tally) Add(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if forgot, ok := t.names.Touch(name); ok {
		delete(t.n, forgot)
	}
	t.n[name]++
}

// Counts returns the names held with their counts.
func (t *Tally) Counts() map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.n)
}
