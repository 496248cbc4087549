package doic

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/diameter"
)

// DefaultMaxReports bounds a Table by default.
const DefaultMaxReports = 10000

// Report is an overload report in force.
type Report struct {
	Type      ReportType
	Name      string // the host, realm or peer it is about (lowercased)
	Seq       uint64
	Reduction uint32
	Received  time.Time
	Expires   time.Time
	n         atomic.Uint64 // requests the report applied to
	throttled atomic.Uint64
}

// Throttle applies the loss algorithm to one more request: true when this
// request is one of the Reduction out of every hundred to throttle.
func (r *Report) Throttle() bool {
	p := uint64(r.Reduction)
	n := r.n.Add(1)
	if n*p/100 > (n-1)*p/100 {
		r.throttled.Add(1)
		return true
	}
	return false
}

// Table holds the reports in force, by type and name. Lookups take a read
// lock and do not allocate; a report is made only when one is taken.
type Table struct {
	mu       sync.RWMutex
	m        [numTypes]map[string]*Report
	max      int
	count    atomic.Int64
	received atomic.Int64
	ignored  [numReasons]atomic.Int64
}

// NewTable returns an empty table of at most max reports (≤ 0: the default).
func NewTable(max int) *Table {
	t := &Table{max: max}
	if t.max <= 0 {
		t.max = DefaultMaxReports
	}
	for i := range t.m {
		t.m[i] = map[string]*Report{}
	}
	return t
}

// SetMax changes the bound (reports beyond it stay until they expire).
func (t *Table) SetMax(max int) {
	if max <= 0 {
		max = DefaultMaxReports
	}
	t.mu.Lock()
	t.max = max
	t.mu.Unlock()
}

// Count records an ignored AVP's reason.
func (t *Table) Count(r Reason) {
	if r != OK && r < numReasons {
		t.ignored[r].Add(1)
	}
}

// Ignored returns how many AVPs were ignored for r.
func (t *Table) Ignored(r Reason) int64 { return t.ignored[r].Load() }

// Received returns how many valid reports were read (taken or not).
func (t *Table) Received() int64 { return t.received.Load() }

// Apply takes report o about name (the answer's Origin-Host for a HOST
// report, its Origin-Realm for a REALM one, the adjacent peer for a PEER
// one) by the sequence rules of the package doc, at now. It reports OK
// when o is in force or ended the report in force, or why it was not;
// taken says o changed the table (a new report, a replacement or an end),
// which the agent shares with its replicas.
func (t *Table) Apply(name []byte, o OLR, now time.Time) (r Reason, taken bool) {
	t.received.Add(1)
	r, taken = t.take(name, o, now)
	if r != OK {
		t.Count(r)
	}
	return r, taken
}

// Merge takes a report another replica shared (internal/olrshare) by the
// same sequence rules, at now: it is not counted as received, and one it
// does not take is not counted as ignored (the replica that received it
// counted it). It reports whether the table changed.
func (t *Table) Merge(typ ReportType, name string, seq uint64, reduction uint32, validity time.Duration, now time.Time) bool {
	if typ >= numTypes {
		return false
	}
	_, taken := t.take([]byte(name), OLR{Type: typ, Seq: seq, Reduction: reduction, Validity: validity}, now)
	return taken
}

func (t *Table) take(name []byte, o OLR, now time.Time) (Reason, bool) {
	m := t.m[o.Type]
	t.mu.RLock()
	cur := lookupFold(m, name)
	t.mu.RUnlock()
	if cur != nil && o.Seq <= cur.Seq {
		if o.Seq < cur.Seq {
			return Stale, false
		}
		return OK, false // the same report again: every answer repeats it
	}
	key := strings.ToLower(string(name))
	t.mu.Lock()
	defer t.mu.Unlock()
	cur = m[key]
	switch {
	case cur != nil && o.Seq <= cur.Seq: // raced with another answer
		return OK, false
	case o.Reduction == 0 || o.Validity == 0: // the overload is over
		if cur != nil {
			delete(m, key)
			t.count.Add(-1)
			return OK, true
		}
		return OK, false
	case cur == nil && int(t.count.Load()) >= t.max:
		t.sweepLocked(now)
		if int(t.count.Load()) >= t.max {
			return TableFull, false
		}
	}
	if cur == nil {
		t.count.Add(1)
	}
	m[key] = &Report{Type: o.Type, Name: key, Seq: o.Seq, Reduction: o.Reduction, Received: now, Expires: now.Add(o.Validity)}
	return OK, true
}

// Lookup returns the report in force about name, or nil.
func (t *Table) Lookup(typ ReportType, name []byte, now time.Time) *Report {
	if t.count.Load() == 0 {
		return nil
	}
	t.mu.RLock()
	r := lookupFold(t.m[typ], name)
	t.mu.RUnlock()
	if r == nil || !now.Before(r.Expires) {
		return nil
	}
	return r
}

// Empty reports whether no report is held (expired ones count until swept).
func (t *Table) Empty() bool { return t.count.Load() == 0 }

// Sweep drops expired reports.
func (t *Table) Sweep(now time.Time) {
	t.mu.Lock()
	t.sweepLocked(now)
	t.mu.Unlock()
}

func (t *Table) sweepLocked(now time.Time) {
	for _, m := range t.m {
		for k, r := range m {
			if !now.Before(r.Expires) {
				delete(m, k)
				t.count.Add(-1)
			}
		}
	}
}

// ReportView is a report in force, for the admin view.
type ReportView struct {
	Type      string    `json:"type"`
	Name      string    `json:"name"`
	Sequence  uint64    `json:"sequence"`
	Reduction uint32    `json:"reduction_percent"`
	Received  time.Time `json:"received"`
	Expires   time.Time `json:"expires"`
	Applied   uint64    `json:"applied"`   // requests it applied to
	Throttled uint64    `json:"throttled"` // of which throttled
}

// View lists the reports in force at now, by type then name.
func (t *Table) View(now time.Time) []ReportView {
	t.mu.RLock()
	var out []ReportView
	for _, m := range t.m {
		for _, r := range m {
			if now.Before(r.Expires) {
				out = append(out, ReportView{Type: r.Type.String(), Name: r.Name, Sequence: r.Seq, Reduction: r.Reduction,
					Received: r.Received, Expires: r.Expires, Applied: r.n.Load(), Throttled: r.throttled.Load()})
			}
		}
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Type != out[j].Type {
			return out[i].Type < out[j].Type
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// lookupFold finds key in m ignoring ASCII case (nil: none).
func lookupFold(m map[string]*Report, key []byte) *Report {
	r, _ := diameter.LookupFold(m, key)
	return r
}
