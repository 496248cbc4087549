// Package olrshare shares a Diameter agent's overload reports in force
// (DOIC, internal/doic) among the agent's replicas through a store (Redis
// in production, MemStore in tests), so that an OC-OLR one replica reads
// in a server's answer reduces what every replica sends there.
//
// The rule (the agent obeys exactly this):
//
//   - Nothing on a request's path. A report the agent's table takes (new,
//     replacing, or ending one) is queued; one goroutine writes the queue
//     and, every Interval, reads the store's reports and merges them into
//     the table.
//   - Conflicts by sequence number (RFC 7683 §5.5.2). The store keeps, per
//     (type, name), the report with the highest OC-Sequence-Number: a write
//     with an equal or lower one than the report the store holds in force
//     changes nothing (one atomic step in the store). The table takes a
//     report read from the store by the same rule, so every replica ends
//     with the highest sequence number any of them received.
//   - Expiry by the store's clock. A report is written with the validity
//     it has left and the store keeps its expiry by its own clock; a read
//     gives each report the validity it has left by that clock, which the
//     reader adds to its own now. A report whose validity ran out is
//     neither written nor read. An ended report (reduction or validity 0)
//     is kept in the store, with the sequence number that ended it, until
//     the report it ended would have expired, so that every replica ends it.
//   - Store faults (internal/storefault.Health): a call without an answer
//     counts toward marking the store down (DownFailures in a row spanning
//     DownAfter); while it is down, each replica keeps the reports it
//     received itself (local only), queues what its table took (at most
//     Backlog keys; the newest report per key), and pings the store every
//     Interval. When it answers again, the queue is written (reconciled,
//     with the sequence rule deciding against what others wrote
//     meanwhile) and reads resume. The transition is logged once each way.
package olrshare

import (
	"context"
	"time"

	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/storefault"
)

// Entry is a report as the store keeps it.
type Entry struct {
	Type      doic.ReportType
	Name      string // the host, realm or peer it is about, lowercased
	Seq       uint64
	Reduction uint32 // 0: the report ended
	// Remaining is the validity left: what a write gives the store, what
	// a read gives by the store's clock.
	Remaining time.Duration
}

// Store is where the replicas of one agent keep their reports.
type Store interface {
	// Offer writes each entry unless the store holds a report in force for
	// its (type, name) with an equal or higher sequence number, each in
	// one atomic step, all in one round trip; an entry with reduction 0
	// ends the report in force (and is not written when none is). One
	// error per entry, nil when the store answered.
	Offer(ctx context.Context, entries []Entry) []error
	// Read returns the reports the store holds in force, Remaining by its
	// clock, and how many values it could not parse (left out).
	Read(ctx context.Context) (entries []Entry, malformed int, err error)
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// Trouble is what a Store returns for a call the store could not do.
type Trouble = storefault.Error

// Config is the shared level's configuration.
type Config struct {
	Store Store
	// Name says which store it is, for the view and logs ("redis main").
	Name string
	// Interval is how often the store is read (and, while down, pinged):
	// a report one replica takes is in force at the others within about
	// one Interval (default DefaultInterval).
	Interval time.Duration
	// Backlog bounds the reports waiting to be written (default
	// DefaultBacklog keys); one more is dropped and counted.
	Backlog int
	// Timeout bounds each call (default DefaultTimeout).
	Timeout time.Duration
	// DownFailures and DownAfter: the evidence a store must give before it
	// is marked down (defaults 3 and 1 s, as diambind's).
	DownFailures int
	DownAfter    time.Duration
}

// Defaults of Config.
const (
	DefaultInterval     = time.Second
	DefaultBacklog      = 10_000
	DefaultTimeout      = 500 * time.Millisecond
	DefaultDownFailures = 3
	DefaultDownAfter    = time.Second
	batch               = 256
)

func (c *Config) setDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Interval, DefaultInterval)
	def(&c.Timeout, DefaultTimeout)
	def(&c.DownAfter, DefaultDownAfter)
	if c.Backlog <= 0 {
		c.Backlog = DefaultBacklog
	}
	if c.DownFailures <= 0 {
		c.DownFailures = DefaultDownFailures
	}
}

// Valid says whether an entry read from the store can be a report: values
// from the store are network input (a known type, a name that is a word of
// at most 255 bytes, a reduction of at most 100, a validity left of at
// most 24 h).
func Valid(e Entry) bool {
	return e.Type <= doic.PeerReport && storefault.Word(e.Name, 255) && e.Reduction <= 100 &&
		e.Remaining <= doic.MaxValidity
}
