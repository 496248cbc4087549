package quota

import (
	"fmt"
	"math"
	"time"

	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// Config is one cluster-wide limit: Limit requests per second per peer,
// shared by all replicas with the same Prefix.
type Config struct {
	Prefix  string // store key prefix (module and profile name)
	Replica string // this replica's unique name
	Limit   float64
	Burst   int // cluster-wide burst; 0: ratelimit.DefaultBurst(Limit)

	Interval         time.Duration // sync interval; default 250 ms
	Floor            float64       // floor share, a fraction of the equal share; default 0.1
	ReplicaTTL       time.Duration // heartbeat lifetime; default 4 intervals
	MaxPeers         int           // tracked peers; default 10,000
	IdleSyncs        int           // syncs without traffic before a peer is dropped; default 4
	ExpectedReplicas int           // replica count assumed before the first sync; default 1

	defaultBurst bool // Burst was 0: shares get at least shareTolerance (see apply)
}

// shareTolerance is the least burst tolerance, in time, of a share under
// the default burst: twice a local limit's 50 ms (ratelimit.DefaultBurst).
// A share's bucket loses the capacity of any pause in its arrivals longer
// than its tolerance; through three bin/caddy replicas on a loaded 2-core
// machine, 50 ms lost up to 3–4 % of the limit over 10 s, and 100 ms costs
// at most R × 0.1 s more admitted after a pause of every replica at once.
const shareTolerance = 100 * time.Millisecond

func (c *Config) defaults() error {
	if c.Replica == "" {
		return fmt.Errorf("replica name is empty")
	}
	if !(c.Limit > 0) || math.IsInf(c.Limit, 0) {
		return fmt.Errorf("limit %v: must be a positive number per second", c.Limit)
	}
	if c.Burst < 0 {
		return fmt.Errorf("burst %d: must not be negative", c.Burst)
	}
	if c.Burst == 0 {
		c.Burst, c.defaultBurst = ratelimit.DefaultBurst(c.Limit), true
	}
	if c.Interval == 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.Interval < time.Millisecond {
		return fmt.Errorf("sync interval %v: must be at least 1ms", c.Interval)
	}
	if c.Floor == 0 {
		c.Floor = 0.1
	}
	if c.Floor < 0 || c.Floor > 1 {
		return fmt.Errorf("floor %v: must be within 0-1 (a fraction of the equal share)", c.Floor)
	}
	if c.ReplicaTTL == 0 {
		c.ReplicaTTL = 4 * c.Interval
	}
	if c.ReplicaTTL < c.Interval {
		return fmt.Errorf("replica TTL %v: must be at least the sync interval %v", c.ReplicaTTL, c.Interval)
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = 10000
	}
	if c.MaxPeers < 1 {
		return fmt.Errorf("max peers %d: must be positive", c.MaxPeers)
	}
	if c.IdleSyncs == 0 {
		c.IdleSyncs = 4
	}
	if c.ExpectedReplicas == 0 {
		c.ExpectedReplicas = 1
	}
	if c.IdleSyncs < 1 || c.ExpectedReplicas < 1 {
		return fmt.Errorf("idle syncs %d, expected replicas %d: must be positive", c.IdleSyncs, c.ExpectedReplicas)
	}
	return nil
}
