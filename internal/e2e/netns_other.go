//go:build !linux

package e2e

import "errors"

func (tp *Topology) In(host string, f func() error) error {
	return errors.New("network namespaces need Linux")
}
