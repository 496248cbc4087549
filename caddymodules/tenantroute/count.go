package tenantroute

import (
	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// countingGuard is the client side's relay filter: ldapwire.TenantGuard
// decides what passes, and each message that begins in the bytes it
// passes is counted toward the tenant's request rate (auto partitions'
// target_requests_per_node), one Lease.Requests call per read: no lock,
// no allocation. The guard passes a message's bytes only once its header
// is whole, so framing the passed bytes again finds every message start.
type countingGuard struct {
	guard  ldapwire.TenantGuard
	lease  *placement.Lease
	maxLen int64
	rest   int // bytes of the current message not yet passed
}

func (c *countingGuard) Feed(b []byte) (int, error) {
	n, err := c.guard.Feed(b)
	c.lease.Requests(c.count(b[:n]))
	return n, err
}

// count frames the passed bytes p and returns how many messages begin in
// them.
func (c *countingGuard) count(p []byte) (msgs int) {
	for i := 0; i < len(p); {
		if c.rest > 0 {
			k := min(c.rest, len(p)-i)
			i += k
			c.rest -= k
			continue
		}
		size, _, err := ldapwire.Frame(p[i:], c.maxLen)
		if err != nil {
			return msgs // the guard passed nothing it could not frame
		}
		msgs++
		c.rest = size
	}
	return msgs
}
