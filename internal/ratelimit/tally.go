package ratelimit

import (
	"cmp"
	"slices"
	"sync/atomic"
)

// Verdict is what became of a message: admitted, or refused with an
// answer (rejected) or without one (dropped).
type Verdict int

const (
	Admitted Verdict = iota
	Rejected
	Dropped
	numVerdicts
)

// Verdicts are the verdicts' names, by Verdict.
var Verdicts = [numVerdicts]string{"admitted", "rejected", "dropped"}

// OtherType names the message type of the messages no message limit
// covers, in a profile's tallies.
const OtherType = "other"

// Tally counts one message type's decisions in one profile by verdict.
// Each count has its own cache line: the admitted and rejected counts of
// a busy type are written from every core at once.
type Tally struct {
	n [numVerdicts]struct {
		atomic.Uint64
		_ [56]byte
	}
}

// Add counts one decision.
func (t *Tally) Add(v Verdict) { t.n[v].Add(1) }

// Count returns the decisions of verdict v so far.
func (t *Tally) Count(v Verdict) uint64 { return t.n[v].Load() }

// Counts returns the decisions so far by verdict.
func (t *Tally) Counts() [numVerdicts]uint64 {
	var out [numVerdicts]uint64
	for v := range out {
		out[v] = t.Count(Verdict(v))
	}
	return out
}

// TypeTally is a message type's tally in a profile.
type TypeTally struct {
	Profile, Type string
	*Tally
}

// Count counts one decision about a message of type msg: 0 for
// OtherType, i+1 for the i-th message rule given to NewProfile. It is
// one atomic add, no lookup.
func (p *Profile) Count(msg int, v Verdict) { p.tallies[msg].Add(v) }

// Tallies returns the tallies of every profile and message type the
// store has had attached since it was made, by profile and type: they
// outlive the generations (a reload continues them, a type or profile
// a reload removed keeps its counts) and go only with the store.
func (s *Store) Tallies() []TypeTally {
	s.mu.Lock()
	out := make([]TypeTally, 0, len(s.tallies))
	for k, t := range s.tallies {
		out = append(out, TypeTally{k.profile, k.limit, t})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b TypeTally) int {
		return cmp.Or(cmp.Compare(a.Profile, b.Profile), cmp.Compare(a.Type, b.Type))
	})
	return out
}

// adoptTallies makes p count on the store's tallies of its (profile,
// message type) pairs, adding those the store lacks: the store keeps
// counting across generations. Call it with s.mu held, before p is in
// use.
func (s *Store) adoptTallies(p *Profile) {
	for i, typ := range p.tallyTypes() {
		k := tableKey{p.Name, typ}
		if t := s.tallies[k]; t != nil {
			p.tallies[i] = t
		} else {
			s.tallies[k] = p.tallies[i]
		}
	}
}

// tallyTypes are the message types of p's tallies, by index.
func (p *Profile) tallyTypes() []string {
	out := make([]string, len(p.tallies))
	out[0] = OtherType
	for i, r := range p.order {
		out[i+1] = r.Name
	}
	return out
}
