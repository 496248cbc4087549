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
// is whole and valid, so reading the lengths of the passed bytes again
// finds every message start.
type countingGuard struct {
	guard ldapwire.TenantGuard
	lease *placement.Lease
	rest  int // bytes of the current message not yet passed
}

func (c *countingGuard) Feed(b []byte) (int, error) {
	n, err := c.guard.Feed(b)
	c.lease.Requests(c.count(b[:n]))
	return n, err
}

// envelopeSize is the size of the LDAPMessage starting b, read from its
// SEQUENCE header alone: the guard has framed and checked it already
// (ldapwire.Frame), so only the length is decoded here.
func envelopeSize(b []byte) (int, bool) {
	if len(b) < 2 {
		return 0, false
	}
	if b[1] < 0x80 {
		return 2 + int(b[1]), true
	}
	n := int(b[1] & 0x7f)
	if n == 0 || n > 4 || len(b) < 2+n {
		return 0, false
	}
	length := 0
	for _, o := range b[2 : 2+n] {
		length = length<<8 | int(o)
	}
	return 2 + n + length, true
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
		size, ok := envelopeSize(p[i:])
		if !ok {
			return msgs // the guard passed nothing it could not frame
		}
		msgs++
		c.rest = size
	}
	return msgs
}
