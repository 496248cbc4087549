package latencybucket

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// states keeps each named policy's process state (probers, measurement
// windows, sticky pins) across config reloads. A config generation takes a
// reference at Provision (LoadOrNew) and gives it back at Cleanup (Delete);
// Caddy provisions the new generation before it cleans up the old one, so
// the state lives on through a reload and is destroyed only when no
// generation uses its name any more.
var states = caddy.NewUsagePool()

// stateKey names a state: the policy name within its kind, so an HTTP and a
// layer4 policy never share one.
type stateKey struct{ kind, name string }

// pooledState is a pool value: the engine's state plus its name.
type pooledState struct {
	*pubsel.State
	key stateKey
	// picking is the pick rule of the latest config that provisioned a
	// policy over the state (per config, not kept: see the README), for
	// the admin view.
	picking atomic.Pointer[picking]
}

type picking struct {
	within    string
	slowStart time.Duration
}

func (s *pooledState) within() string {
	if p := s.picking.Load(); p != nil && p.within != "" {
		return p.within
	}
	return "random"
}

func (s *pooledState) slowStart() time.Duration {
	if p := s.picking.Load(); p != nil {
		return p.slowStart
	}
	return 0
}

// Destruct stops the state's probers and clock; the pool calls it when the
// last generation lets go.
func (s *pooledState) Destruct() error {
	s.Close()
	return nil
}

// pooledStates lists the live states by name and kind, for the admin API
// and metrics.
func pooledStates() []*pooledState {
	var out []*pooledState
	states.Range(func(_, v any) bool {
		out = append(out, v.(*pooledState))
		return true
	})
	slices.SortFunc(out, func(a, b *pooledState) int {
		return cmp.Or(cmp.Compare(a.key.name, b.key.name), cmp.Compare(a.key.kind, b.key.kind))
	})
	return out
}

// picks keeps each policy name's pick counts (the selections metric, the
// admin view's picks_total) for the life of the process, whatever states
// come and go under the name: a policy or publisher that leaves the config
// keeps its counts, shown as they were, and they go on if it comes back.
var picks struct {
	sync.Mutex
	byName map[string]*pubsel.Picks
}

// picksOf returns the pick counts of the policy name.
func picksOf(name string) *pubsel.Picks {
	picks.Lock()
	defer picks.Unlock()
	if picks.byName == nil {
		picks.byName = map[string]*pubsel.Picks{}
	}
	if picks.byName[name] == nil {
		picks.byName[name] = new(pubsel.Picks)
	}
	return picks.byName[name]
}

// allPicks returns the pick counts of every policy name used so far.
func allPicks() map[string]*pubsel.Picks {
	picks.Lock()
	defer picks.Unlock()
	return maps.Clone(picks.byName)
}

// Interface guards
var _ caddy.Destructor = (*pooledState)(nil)
