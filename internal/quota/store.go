package quota

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Store is what one pipelined round trip to the shared store does for a
// sync (see the package comment for the Redis commands). An implementation
// only carries bytes and says what its errors mean (Classify): the engine
// validates every answer and asks Classify once per error.
type Store interface {
	// Sync runs the batch. An error means the round trip failed as a
	// whole (store unreachable: no command answered); errors of single
	// commands go in the Answer.
	Sync(ctx context.Context, b *Batch) (*Answer, error)
	// Classify says what err means: an error of one of the store's
	// commands, of its round trip, or one the engine wrapped around
	// either. For StoreTrouble, reason names it in one word of a bounded
	// set, fit for a metric label (noperm, clusterdown, timeout, …);
	// reason is "" for the other kinds.
	Classify(err error) (kind ErrorKind, reason string)
}

// ErrorKind is what a store error means to the engine.
type ErrorKind int

const (
	// NoError: err is nil.
	NoError ErrorKind = iota
	// NotFound: the key or field does not exist.
	NotFound
	// Malformed: the store answered, and the value it holds is not one
	// the engine wrote (another program's key of another type, a field
	// that is not an integer): ignored, counted and repaired.
	Malformed
	// StoreTrouble: the store could not do what was asked for the keys
	// the command touched: those peers get the fallback share.
	StoreTrouble
)

// GroupStore runs several batches in one round trip (SyncGroup: a
// profile's overall and message-type limits). Answers are in order; an
// error means the round trip failed as a whole.
type GroupStore interface {
	Store
	SyncGroup(ctx context.Context, bs []*Batch) ([]*Answer, error)
}

// Batch is one replica's sync.
type Batch struct {
	Prefix     string
	Replica    string
	Now        time.Time
	ReplicaTTL time.Duration // heartbeat lifetime
	KeyTTL     time.Duration // lifetime of an epoch's counters
	Epoch      int64         // epoch the counts are added to
	Counts     []Count       // peers with traffic since the last sync
	Read       []string      // peers whose totals of epoch Epoch−1 to read
	// NoHeartbeat leaves out the heartbeat (ZADD, ZREMRANGEBYSCORE,
	// ZCARD, ZCOUNT): a batch that rides in a group behind one that has it.
	NoHeartbeat bool
	// Reserving marks the heartbeat: this replica enforces the fallback
	// share for some peer until its next sync, and writes no counts of
	// those peers, so the others count it at its fallback share (its
	// score is the time negated: see HeartbeatScore). The peers it does
	// count are not at the fallback share: each count adds 1 to the
	// peer's field r (HINCRBY K r 1), so the others leave no room for it
	// there (its demand is in the total). Set on every batch of a group.
	Reserving bool
	// Fresh is the start of epoch Epoch−1 on the store's clock: a live
	// replica whose heartbeat is older missed its last sync, and the
	// others count it at its fallback share too (Answer.Reserved).
	Fresh time.Time
	// Time asks for the store's clock (TIME, first in the pipeline):
	// the heartbeat's batch, and the probe before a replica's first sync.
	Time bool
	// Repair lists keys the limiter owns that held values it did not
	// write (another program's type, a field that is not a count): they
	// are deleted first (DEL), so that the counts of this sync start them
	// afresh.
	Repair []string
}

// Count is one peer's counts since the last sync.
type Count struct {
	Peer               string
	Admitted, Demanded uint64
	// Probe: a peer whose keys the store refused is asked again with a
	// zero count (HINCRBY a 0, HINCRBY d 0, PEXPIRE; never r, even in a
	// Reserving batch: this replica is at its fallback share there).
	Probe bool
}

// Answer is the store's reply to a Batch, unparsed.
type Answer struct {
	// Replicas is the live replica count (ZCARD), or ReplicasErr: the
	// first error of the heartbeat's commands (ZADD, ZREMRANGEBYSCORE,
	// ZCARD).
	Replicas    int64
	ReplicasErr error
	// Reserved is how many live replicas, this one included if its
	// batch was Reserving, are counted at their fallback share: marked
	// Reserving, or whose heartbeat is older than Batch.Fresh (ZCOUNT).
	// Its error is ReplicasErr.
	Reserved int64
	// Time is the store's clock (Batch.Time), or TimeErr.
	Time    time.Time
	TimeErr error
	// Totals holds one entry per Batch.Read peer, in order.
	Totals []Raw
	// CountErrs holds one entry per Batch.Counts peer: nil, or the error
	// of one of its commands.
	CountErrs []error
}

// Raw is one peer's totals as the store returned them: nil for a missing
// field, Err for a failed command.
type Raw struct {
	Admitted, Demanded []byte
	// Marked is field r: how many replicas counted the peer in a
	// Reserving batch (at their proportional share for it).
	Marked []byte
	Err    error
}

// ReplicasKey is the sorted set of live replicas.
func ReplicasKey(prefix string) string { return "{" + prefix + "}:replicas" }

// HeartbeatScore is a replica's score in the replicas key: the time of its
// sync in ms on the store's clock, negated when it is reserving its
// fallback share. So one ZREMRANGEBYSCORE of (−cutoff, cutoff) removes
// the replicas silent since cutoff, marked or not, and one ZCOUNT of
// (−inf, fresh) counts the live replicas that the others count at their
// fallback share: the marked ones and those that missed their last sync.
func HeartbeatScore(now time.Time, reserving bool) int64 {
	if reserving {
		return -now.UnixMilli()
	}
	return now.UnixMilli()
}

// PeerKey is the hash of a peer's totals in an epoch: hash-tagged by prefix
// and peer so that Redis Cluster spreads peers over its shards. '%', '{'
// and '}' in the peer (client-controlled) are percent-escaped so that the
// tag stays the whole of prefix and peer and two peers never share a key.
func PeerKey(prefix, peer string, epoch int64) string {
	return "{" + prefix + ":" + escape(peer) + "}:" + strconv.FormatInt(epoch, 10)
}

func escape(s string) string {
	if !strings.ContainsAny(s, "%{}") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '{', '}':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// MaxCount bounds a count read from the store: 2⁴⁰ requests in one epoch
// is far beyond any cluster, so a larger value is not a count (and a store
// clamps an increment to it).
const MaxCount = 1 << 40

// parseCount validates one count field; a missing field is zero.
func parseCount(b []byte) (uint64, bool) {
	if b == nil {
		return 0, true
	}
	if len(b) == 0 || len(b) > 13 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil || n > MaxCount {
		return 0, false
	}
	return n, true
}
