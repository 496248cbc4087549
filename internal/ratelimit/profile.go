package ratelimit

// Profile is a peer rate-limit profile, as Cisco vDRA has them, with its
// message rate-limit profiles: an overall limit and limits per message
// type, each applied per key (a peer for ingress, an upstream group for
// egress). Message types without a limit are forwarded as received,
// subject only to the overall limit.
type Profile struct {
	Name     string
	Overall  *Rule // nil: no overall limit
	overall  *Table
	messages map[string]limited
	maxKeys  int
	global   Allower // set: decides the overall limit instead of overall
	// order are the message rules as given; tallies[0] counts the other
	// types' decisions, tallies[i+1] order[i]'s (see Count).
	order   []*Rule
	tallies []*Tally
}

// Allower decides one request of a key at now by a limit kept elsewhere:
// a cluster-wide limit's local share (internal/quota).
type Allower interface {
	Allow(key string, now int64) bool
}

// SetGlobal makes the overall limit cluster-wide: a decides it instead of
// the profile's own table (whose rule stays the configured limit, for
// views and throttling). Call it before the profile is in use.
func (p *Profile) SetGlobal(a Allower) { p.global = a }

// Global returns what SetGlobal set, or nil.
func (p *Profile) Global() Allower { return p.global }

type limited struct {
	rule   *Rule
	table  *Table
	global Allower // set: decides the message type's limit instead of table
}

// Refunder is an Allower that can give back an admission (a message
// type's admission when the overall limit refuses the message).
type Refunder interface {
	Refund(key string, now int64)
}

// SetMessageGlobal makes a message type's limit cluster-wide: a decides
// it instead of the profile's own table. It should also be a Refunder.
// Call it before the profile is in use.
func (p *Profile) SetMessageGlobal(msgType string, a Allower) {
	if m, ok := p.messages[msgType]; ok {
		m.global = a
		p.messages[msgType] = m
	}
}

// MessageGlobal returns what SetMessageGlobal set for msgType, or nil.
func (p *Profile) MessageGlobal(msgType string) Allower { return p.messages[msgType].global }

// NewProfile returns a profile whose tables hold at most maxKeys keys each.
func NewProfile(name string, overall *Rule, messages []*Rule, maxKeys int) *Profile {
	p := &Profile{Name: name, Overall: overall, messages: map[string]limited{}, maxKeys: maxKeys,
		order: messages, tallies: []*Tally{new(Tally)}}
	if overall != nil {
		p.overall = NewTable(maxKeys)
	}
	for _, r := range messages {
		p.messages[r.Name] = limited{rule: r, table: NewTable(maxKeys)}
		p.tallies = append(p.tallies, new(Tally))
	}
	return p
}

// Message returns the rule of a message type, or nil.
func (p *Profile) Message(msgType string) *Rule { return p.messages[msgType].rule }

// Rules returns the overall rule (if any) and the message rules.
func (p *Profile) Rules() []*Rule {
	var out []*Rule
	if p.Overall != nil {
		out = append(out, p.Overall)
	}
	for _, m := range p.messages {
		out = append(out, m.rule)
	}
	return out
}

// Decide admits one message of msgType from key at now, or names the limit
// that refused it: the message type's, or "overall". A message refused by
// the overall limit gives back what its type's limit had admitted.
func (p *Profile) Decide(key, msgType string, now int64) (ok bool, limit string) {
	var mb *Bucket
	m, typed := p.messages[msgType]
	if typed {
		if m.global != nil {
			if !m.global.Allow(key, now) {
				return false, msgType
			}
		} else if mb = m.table.Bucket(key, now); !mb.Allow(m.rule, now) {
			return false, msgType
		}
	}
	if p.Overall != nil && !p.allowOverall(key, now) {
		if mb != nil {
			mb.Refund(m.rule)
		} else if r, ok := m.global.(Refunder); typed && ok {
			r.Refund(key, now)
		}
		return false, "overall"
	}
	return true, ""
}

func (p *Profile) allowOverall(key string, now int64) bool {
	if p.global != nil {
		return p.global.Allow(key, now)
	}
	return p.overall.Bucket(key, now).Allow(p.Overall, now)
}

// Sweep drops refilled buckets unused since idleBefore.
func (p *Profile) Sweep(idleBefore, now int64) {
	if p.overall != nil {
		p.overall.Sweep(idleBefore, now)
	}
	for _, m := range p.messages {
		m.table.Sweep(idleBefore, now)
	}
}

// Keys returns how many keys the profile's tables hold.
func (p *Profile) Keys() int {
	n := 0
	if p.overall != nil {
		n = p.overall.Len()
	}
	for _, m := range p.messages {
		n += m.table.Len()
	}
	return n
}

// overallLimit names the overall limit among a profile's tables.
const overallLimit = "overall"

// tables calls f with each limit's name, rule and table, letting f
// replace the table (a Store hands out the ones it keeps across
// configurations). It writes the profile: call it only before the
// profile is in use.
func (p *Profile) tables(f func(limit string, r *Rule, t *Table) *Table) {
	if p.overall != nil {
		p.overall = f(overallLimit, p.Overall, p.overall)
	}
	for name, m := range p.messages {
		m.table = f(name, m.rule, m.table)
		p.messages[name] = m
	}
}

// eachTable calls f with each limit's name, rule and table. It only
// reads the profile, so it may run while the profile admits requests.
func (p *Profile) eachTable(f func(limit string, r *Rule, t *Table)) {
	if p.overall != nil {
		f(overallLimit, p.Overall, p.overall)
	}
	for name, m := range p.messages {
		f(name, m.rule, m.table)
	}
}
