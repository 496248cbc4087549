//go:build !linux

package e2e

import (
	"testing"
	"time"
)

// Delay needs Linux (network namespaces and NFQUEUE).
func (tp *Topology) Delay(t testing.TB, host string, delays map[string]time.Duration) {
	t.Fatal("packet delay needs Linux (network namespaces and NFQUEUE)")
}
