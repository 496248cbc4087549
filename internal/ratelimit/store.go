package ratelimit

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/monoclock"
)

// Store is the state of one named limiter that outlives a configuration:
// the per-key buckets of each (profile, limit) pair, the dynamic
// controller's level and reversal timing, and the decision tallies of
// each (profile, message type) pair. Each configuration generation
// attaches its own profiles, rules and controller settings; the buckets,
// the controller's state and the tallies carry over from one to the next.
//
// Settings follow the newest attached generation. When a generation
// detaches — the old one after a reload, or a new one whose load failed —
// the newest remaining one's settings apply again, so a failed load changes
// nothing. Rules belong to their generation: a changed rate or burst takes
// effect through the new generation's rules over the same buckets (a
// key's debt is rescaled so that the admissions it has outstanding stay the
// same; see Table.Rescale).
type Store struct {
	// Clock returns the time in unix nanoseconds (default: the wall
	// clock; tests set their own).
	Clock func() int64

	mu     sync.Mutex
	gens   []*Attachment // oldest first
	tables map[tableKey]*storedTable
	// tallies are the decision counts by (profile, message type), kept
	// for the store's life (see Tallies).
	tallies map[tableKey]*Tally
	ctl     *Dynamic // the controller in force, owned by an attached generation; nil if none
	active  *Attachment
	newest  atomic.Pointer[Attachment]
}

type tableKey struct{ profile, limit string }

// storedTable is a table and the rule its buckets' debts were run up under.
type storedTable struct {
	*Table
	rule *Rule
}

// Generation is what one configuration brings to a store.
type Generation struct {
	Profiles []*Profile
	// Dynamic holds the controller's settings, nil if the generation has
	// no dynamic throttling.
	Dynamic *Dynamic
	// Throttled are the rules the controller throttles.
	Throttled []*Rule
	// Payload is the caller's own, handed back by Newest and Active.
	Payload any
}

// Attachment is a generation attached to a store.
type Attachment struct {
	store *Store
	gen   Generation
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{tables: map[tableKey]*storedTable{}, tallies: map[tableKey]*Tally{}, Clock: func() int64 { return monoclock.Now().UnixNano() }}
}

// Attach adds a generation: its profiles take over the store's tables of
// the same (profile, limit) names, bounded by their new max keys, with
// each key's outstanding admissions kept under a changed rate (see
// Table.Rescale: debts scale by old rate / new rate); its
// controller continues the current one's level and reversal timing (see
// Dynamic.Continue); its throttled rules get the current level at once;
// and its profiles count their decisions on the store's tallies (see
// Tallies). The generation's profiles must not be in use yet.
func (s *Store) Attach(g Generation) *Attachment {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range g.Profiles {
		p.tables(func(limit string, r *Rule, own *Table) *Table {
			k := tableKey{p.Name, limit}
			if t := s.tables[k]; t != nil {
				return t.Table
			}
			s.tables[k] = &storedTable{Table: own, rule: r}
			return own
		})
		s.adoptTallies(p)
	}
	a := &Attachment{store: s, gen: g}
	s.gens = append(s.gens, a)
	s.reconcile()
	return a
}

// Detach removes the generation; tables that no attached generation uses
// any more are dropped. It reports whether the store is now empty.
func (a *Attachment) Detach() (empty bool) {
	s := a.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.gens, a); i >= 0 {
		s.gens = slices.Delete(s.gens, i, i+1)
	}
	s.reconcile()
	return len(s.gens) == 0
}

// reconcile applies the newest settings of every part of the state.
func (s *Store) reconcile() {
	type setting struct {
		size int
		rule *Rule
	}
	newest := map[tableKey]setting{}
	var active *Attachment
	for _, a := range s.gens {
		for _, p := range a.gen.Profiles {
			p.eachTable(func(limit string, r *Rule, _ *Table) {
				newest[tableKey{p.Name, limit}] = setting{p.maxKeys, r}
			})
		}
		if a.gen.Dynamic != nil {
			active = a
		}
	}
	now := s.Clock()
	for k, t := range s.tables {
		set, used := newest[k]
		if !used {
			delete(s.tables, k)
			continue
		}
		t.SetSize(set.size)
		if t.rule.Rate != set.rule.Rate {
			t.Rescale(t.rule.Rate/set.rule.Rate, now)
		}
		t.rule = set.rule
	}
	switch {
	case active == nil:
		s.ctl = nil
	case s.ctl != active.gen.Dynamic:
		if s.ctl != nil {
			active.gen.Dynamic.Continue(s.ctl)
		}
		s.ctl = active.gen.Dynamic
	}
	s.active = active
	s.applyLevel()
	if n := len(s.gens); n > 0 {
		s.newest.Store(s.gens[n-1])
	} else {
		s.newest.Store(nil)
	}
}

func (s *Store) applyLevel() {
	level := 0
	if s.ctl != nil {
		level = s.ctl.Throttle()
	}
	for _, a := range s.gens {
		for _, r := range a.gen.Throttled {
			r.SetThrottle(level)
		}
	}
}

// Newest returns the payload of the newest attached generation, or nil.
// It is one atomic load: cheap enough per message.
func (s *Store) Newest() any {
	if a := s.newest.Load(); a != nil {
		return a.gen.Payload
	}
	return nil
}

// Active returns the payload of the generation whose controller settings
// are in force (the newest one with a controller), or nil.
func (s *Store) Active() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		return nil
	}
	return s.active.gen.Payload
}

// Sample feeds one load reading to the controller in force and applies
// its level to every attached generation's throttled rules. ok is false
// when no generation has a controller.
func (s *Store) Sample(load float64, now time.Time) (before, after int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctl == nil {
		return 0, 0, false
	}
	before = s.ctl.Throttle()
	after = s.ctl.Sample(load, now)
	s.applyLevel()
	return before, after, true
}

// ControllerState is the controller's state, for views.
type ControllerState struct {
	Throttle      int
	Load          float64
	SampledAt     time.Time
	ReversalSince time.Time
}

// Controller returns the state of the controller in force.
func (s *Store) Controller() (ControllerState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctl == nil {
		return ControllerState{}, false
	}
	load, at := s.ctl.Last()
	return ControllerState{Throttle: s.ctl.Throttle(), Load: load, SampledAt: at, ReversalSince: s.ctl.ReversalSince()}, true
}

// Sweep drops refilled buckets unused since idleBefore from every table.
func (s *Store) Sweep(idleBefore, now int64) {
	s.mu.Lock()
	tables := make([]*Table, 0, len(s.tables))
	for _, t := range s.tables {
		tables = append(tables, t.Table)
	}
	s.mu.Unlock()
	for _, t := range tables {
		t.Sweep(idleBefore, now)
	}
}

// Tables returns how many (profile, limit) tables the store keeps.
func (s *Store) Tables() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tables)
}
