package gatewaysel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// ResultStore is a second cache level shared by replicas (Redis, in the ogs
// plugin): one replica's probe run serves every replica. The local entries
// stay the first level: a fresh local entry answers without the store. The
// Table reads the store only when a location has no fresh local entry,
// in the background flight that queries wait on (never longer than the
// answer deadline), and never fails a query because of it: any store error
// makes the replica probe locally, as without a store.
//
// One probe run per location across replicas rests on two atomic steps:
// GetOrLock (the value if there is one, else the lock, never a lock taken
// over a value written since it was looked for) and Publish (the result
// written only by the lock's holder, or where no one holds it and nothing
// is stored; otherwise the stored value comes back, and the Table
// answers that one).
//
// Keys are the store's business (the plugin namespaces them by prefix and
// state name); values are opaque bytes that the Table writes and
// validates like network input. Tokens are never empty.
type ResultStore interface {
	// GetOrLock, in one atomic step, returns location's value when it has
	// one other than skip (nil: none to skip); otherwise takes location's
	// probe lock under token for ttl when it is free (Redis: SET NX PX).
	GetOrLock(ctx context.Context, location, token string, ttl time.Duration, skip []byte) (Claim, error)
	// Extend pushes the lock's expiry to ttl from now if token holds it.
	Extend(ctx context.Context, location, token string, ttl time.Duration) (bool, error)
	// Publish, in one atomic step, stores value for ttl and releases the
	// lock if token holds it (token "": holds nothing), or if the lock is
	// free and location has no value (or skip, or one of another type);
	// otherwise it writes nothing and returns the value stored (nil: none).
	Publish(ctx context.Context, location, token string, value []byte, ttl time.Duration, skip []byte) (stored []byte, written bool, err error)
	// Unlock releases location's lock if token still holds it.
	Unlock(ctx context.Context, location, token string) error
}

// Claim is what GetOrLock found.
type Claim struct {
	Value  []byte // the location's value (then no lock was taken)
	Locked bool   // no value: this call took the lock
	// Malformed, if set, says the location's key holds something no value
	// can be (Redis: a key of another type); it counts as no value.
	Malformed error
}

// ErrMalformed wraps a ResultStore's error for a value that is there but cannot
// be one of the Table's (Redis: a key of another type): the value is
// ignored and counted like one that does not parse, and the store is not
// considered down.
var ErrMalformed = errors.New("malformed value")

// StoreKeys says which of a location's keys a store error concerns.
type StoreKeys uint8

const (
	KeysAny   StoreKeys = 0                    // the store as a whole: a timeout, a dropped connection (no telling which keys)
	KeysValue StoreKeys = 1 << (iota - 1)      // location values
	KeysLock                                   // probe locks
	KeysBoth  StoreKeys = KeysValue | KeysLock // both, or either (the store did not say which)
	// KeysReports are the shared client reports (reportsync.go).
	KeysReports StoreKeys = 4
	// KeysGeneration is the store's generation marker (generation.go).
	KeysGeneration StoreKeys = 8
)

func (k StoreKeys) String() string {
	switch k {
	case KeysReports:
		return "reports"
	case KeysGeneration:
		return "generation"
	}
	return [...]string{"any", "value", "lock", "value+lock"}[k&KeysBoth]
}

// StoreTrouble is a Store's error placed: the operation, the keys it was
// refused or failed on, and a reason from a bounded set (for metrics). A
// Store returns one when it can tell; the Table treats any other error
// as trouble of KeysAny, reason "other" ("timeout" past its context).
type StoreTrouble struct {
	Op     string // get_or_lock, extend, publish, unlock
	Keys   StoreKeys
	Reason string
	Err    error
}

func (t *StoreTrouble) Error() string {
	return fmt.Sprintf("%s on %s keys (%s): %v", t.Op, t.Keys, t.Reason, t.Err)
}
func (t *StoreTrouble) Unwrap() error { return t.Err }

// asTrouble places err, an error of op.
func asTrouble(op string, err error) *StoreTrouble {
	var t *StoreTrouble
	if errors.As(err, &t) {
		return t
	}
	reason := "other"
	if errors.Is(err, context.DeadlineExceeded) {
		reason = "timeout"
	}
	return &StoreTrouble{Op: op, Keys: KeysAny, Reason: reason, Err: err}
}

// Store defaults: one store call's bound, how often a replica waiting on
// another's probe run looks for its result, and how long the store is left
// alone after an error (the replica probes locally meanwhile).
const (
	DefaultStoreTimeout = 250 * time.Millisecond
	DefaultStorePoll    = 50 * time.Millisecond
	DefaultStoreRetry   = time.Second
)

// reconcileBatch bounds the locations one reconcile step (recheck.go)
// takes to the store.
const reconcileBatch = 256

// StoreEventKind is what happened with the store, for metrics and logs.
type StoreEventKind int

const (
	StoreError     StoreEventKind = iota // a store call failed (the replica probes locally)
	StoreMalformed                       // a value that does not parse or validate: ignored
	StoreStale                           // a value measured with another probe or other gateways: ignored
	StoreLockWait                        // another replica holds the probe lock: this one waits for its result
	StoreDown                            // the first error on some keys after they worked (or at start)
	StoreUp                              // the first success on those keys after StoreDown
	StoreAdopted                         // this replica's run lost the race: it answers the stored result instead
)

// StoreEvent is reported to Config.OnStore.
type StoreEvent struct {
	Kind     StoreEventKind
	Location string
	Err      error         // StoreError, StoreMalformed, StoreDown: why
	Trouble  *StoreTrouble // StoreError, StoreDown, StoreUp: the operation, keys and reason
}

// StoreTroubleState is keys the store currently fails on, for Snapshot.
type StoreTroubleState struct {
	Keys   StoreKeys
	Op     string // the operation that failed first
	Reason string
	Err    string
	Since  time.Time
}

// storedEntry is a location's value in the store. Order and RTTs name
// gateways, never indices, and Probe and Gateways say what was measured, so
// a replica whose configuration differs recognises the value as stale.
type storedEntry struct {
	Version  int                `json:"v"`
	Probe    string             `json:"probe"`
	Gateways map[string]string  `json:"gateways"` // name → address
	At       time.Time          `json:"at"`
	Order    []string           `json:"order"`
	RTTs     map[string]float64 `json:"rtts_ms"` // measured gateways only
	// Held and HoldUntil: the location's hold (hold.go), validated on use.
	Held      string    `json:"held,omitempty"`
	HoldUntil time.Time `json:"hold_until,omitzero"`
}

const storedVersion = 1

// maxStoredRTT bounds an RTT read from the store: no probe lasts an hour.
const maxStoredRTT = float64(time.Hour / time.Millisecond)

// encodeStored is res as stored, under cfg's probe.
func encodeStored(res *gatewayorder.Result, cfg *Config) ([]byte, error) {
	v := storedEntry{Version: storedVersion, Probe: cfg.ProbeID, Gateways: map[string]string{}, At: res.At.UTC(), RTTs: map[string]float64{}, Held: res.Held, HoldUntil: res.HoldUntil.UTC()}
	for _, g := range res.Gateways {
		v.Gateways[g.Name] = g.Addr
	}
	for _, i := range res.Order {
		v.Order = append(v.Order, res.Gateways[i].Name)
	}
	for i, rtt := range res.RTTs {
		if rtt > 0 {
			v.RTTs[res.Gateways[i].Name] = float64(rtt) / float64(time.Millisecond)
		}
	}
	return json.Marshal(v)
}

// errStale is decodeStored's error for a well-formed value measured with
// another probe or other gateways.
var errStale = errors.New("measured with another probe or other gateways")

// decodeStored validates a stored value against cfg and returns its result
// on cfg's gateways (the order recomputed by the rule, with cfg's backups).
// A value that does not parse, names a gateway it does not list, has an RTT
// that is not a positive number of milliseconds below an hour, or a time in
// the future is malformed; one listing other gateways or addresses, or
// another probe, is errStale.
func decodeStored(data []byte, cfg *Config, now time.Time) (*gatewayorder.Result, error) {
	var v storedEntry
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	switch {
	case v.Version != storedVersion:
		return nil, fmt.Errorf("version %d, want %d", v.Version, storedVersion)
	case v.At.IsZero() || v.At.After(now.Add(time.Minute)):
		return nil, fmt.Errorf("time %v: missing or in the future", v.At)
	case len(v.Gateways) == 0:
		return nil, errors.New("no gateways")
	case len(v.RTTs) == 0:
		return nil, errors.New("no measured gateway")
	}
	for name, ms := range v.RTTs {
		if _, ok := v.Gateways[name]; !ok {
			return nil, fmt.Errorf("RTT of unknown gateway %q", name)
		}
		if math.IsNaN(ms) || ms <= 0 || ms > maxStoredRTT {
			return nil, fmt.Errorf("gateway %q: RTT %v ms out of range", name, ms)
		}
	}
	seen := map[string]bool{}
	for _, name := range v.Order {
		if _, ok := v.Gateways[name]; !ok || seen[name] {
			return nil, fmt.Errorf("order: unknown or repeated gateway %q", name)
		}
		seen[name] = true
	}
	if v.Probe != cfg.ProbeID || len(v.Gateways) != len(cfg.Gateways) {
		return nil, errStale
	}
	rtts := make([]time.Duration, len(cfg.Gateways))
	for i, g := range cfg.Gateways {
		if v.Gateways[g.Name] != g.Addr {
			return nil, errStale
		}
		rtts[i] = time.Duration(v.RTTs[g.Name] * float64(time.Millisecond))
	}
	return &gatewayorder.Result{Gateways: cfg.Gateways, Order: gatewayorder.Order(cfg.Gateways, rtts, cfg.OmitUnmeasured), RTTs: rtts, At: v.At, Held: v.Held, HoldUntil: v.HoldUntil}, nil
}
