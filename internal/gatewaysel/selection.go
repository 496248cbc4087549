package gatewaysel

import (
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// Source says where an answer's order came from.
type Source int

const (
	Probed      Source = iota // a probe run that finished within this query's wait
	Cached                    // a location entry still inside its lifetime
	Previous                  // no fresh result (see Why): the location's previous selection
	Configured                // no fresh result and none before: the configured order
	Partial                   // a probe run still going at the answer deadline: the gateways answered so far
	FromReplica               // a fresh result read from the shared store (another replica's probe run)
	Reported                  // the location's clients' reports (rttreports)
)

func (s Source) String() string {
	return [...]string{"probed", "cache", "previous", "configured", "partial", "shared", "reports"}[s]
}

// Fresh reports whether the selection is a finished probe run's result
// (answers may carry their full TTL), rather than a stand-in until one is.
func (s Source) Fresh() bool { return s == Probed || s == Cached || s == FromReplica || s == Reported }

// Why says why a Previous or Configured selection answered.
type Why int

const (
	WhyNone      Why = iota
	WhyDeadline      // the probe run was still going at the answer deadline
	WhyNoAnswer      // the probe run finished and no gateway answered
	WhyRetryWait     // no gateway answered the last run; the next waits for Retry
	WhyClosed        // the selector is shutting down
)

func (w Why) String() string {
	return [...]string{"", "deadline", "no_answer", "retry_wait", "closed"}[w]
}

// Selection is one query's answer.
type Selection struct {
	*gatewayorder.Result
	Source Source
	Why    Why
	// Failed is the location's latest probe run in which no gateway
	// answered, when that is later than its result (Reasons say why).
	Failed  *gatewayorder.Result
	RetryAt time.Time // after a run in which no gateway answered: the next run's earliest start
	// Reporters, with Source Reported, is the distinct reporters counted.
	Reporters int
	// HoldUntil is when the hold on the first choice ends (hold.go); zero:
	// no hold.
	HoldUntil time.Time
	// LastServer is the first choice of the location's previous answer
	// ("": none), AnyConnect's "Last server".
	LastServer string
	// FirstHit, with Source Cached, says this is the result's first cache
	// hit (so a log line per hit is bounded by results, not queries).
	FirstHit bool
}
