//go:build !linux

package e2e

import "errors"

func (tp *Topology) in(host string, f func() error) error {
	return errors.New("network namespaces need Linux")
}
