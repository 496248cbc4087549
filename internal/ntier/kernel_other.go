//go:build !linux

package ntier

import "errors"

// NetlinkKernel needs Linux.
type NetlinkKernel struct {
	NetNS         string
	WithoutTproxy bool
}

var errNotLinux = errors.New("transparent mode needs Linux (nftables and policy routing)")

func (NetlinkKernel) Apply(RuleSet) error  { return errNotLinux }
func (NetlinkKernel) Remove(RuleSet) error { return errNotLinux }
