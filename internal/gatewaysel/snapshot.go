package gatewaysel

import (
	"slices"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// LocationState is one cached location, as Snapshot reports it.
type LocationState struct {
	Location    string
	Result      *gatewayorder.Result // as answered: with gateways the re-check found dead moved back
	Fresh       bool                 // inside its lifetime and measured with the probe and gateways in force
	FromReplica bool                 // read from the shared store, not probed here
}

// Snapshot is a selector's state for an admin view.
type Snapshot struct {
	Gateways  []gatewayorder.Gateway
	Locations []LocationState     // newest result first, at most the limit asked for
	Total     int                 // locations with a result
	Runs      uint64              // probe runs made by this selector (across reloads)
	LastRun   time.Time           // when the latest finished; zero: none yet
	Store     bool                // a shared store is configured
	StoreUp   bool                // with Store: no keys in trouble (true before the first call)
	Troubles  []StoreTroubleState // with Store: the keys it fails on, by StoreKeys
}

// Snapshot returns the selector's state with at most limit locations, the
// newest results first. It copies pointers under the lock and sorts outside
// it, so a large table does not hold queries up for the sort.
func (s *Table) Snapshot(limit int) Snapshot {
	s.mu.Lock()
	now := s.now()
	snap := Snapshot{Gateways: s.cfg.Gateways, Runs: s.runs, LastRun: s.lastRun, Store: s.cfg.Store != nil, StoreUp: !s.storeDown}
	for _, t := range s.troubles {
		snap.Troubles = append(snap.Troubles, t)
	}
	all := make([]LocationState, 0, len(s.entries))
	for loc, e := range s.entries {
		if e.res == nil {
			continue
		}
		all = append(all, LocationState{Location: loc, Result: s.answered(e), Fresh: s.fresh(e, now), FromReplica: e.fromReplica})
	}
	s.mu.Unlock()
	slices.SortFunc(snap.Troubles, func(a, b StoreTroubleState) int { return int(a.Keys) - int(b.Keys) })
	snap.Total = len(all)
	slices.SortFunc(all, func(a, b LocationState) int {
		if c := b.Result.At.Compare(a.Result.At); c != 0 {
			return c
		}
		if a.Location < b.Location {
			return -1
		}
		return 1
	})
	if len(all) > limit {
		all = all[:limit]
	}
	snap.Locations = all
	return snap
}
