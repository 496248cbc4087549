package tenantroute

import (
	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// countingGuard is the client side's relay filter: ldapwire.TenantGuard
// decides what passes, and the messages that begin in the bytes it passes
// (its Messages count) go toward the tenant's request rate (auto
// partitions' target_requests_per_node), one Lease.Requests call per
// read: no lock, no allocation, no second pass over the bytes.
type countingGuard struct {
	guard   ldapwire.TenantGuard
	lease   *placement.Lease
	counted uint64 // guard.Messages already counted
}

func (c *countingGuard) Feed(b []byte) (int, error) {
	n, err := c.guard.Feed(b)
	c.countPassed()
	return n, err
}

// countPassed counts the messages passed since the last count.
func (c *countingGuard) countPassed() {
	c.lease.Requests(int(c.guard.Messages - c.counted))
	c.counted = c.guard.Messages
}
