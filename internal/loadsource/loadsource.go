// Package loadsource reads a backend's load, in percent, so that a dynamic
// rate limiter can throttle traffic before the backend saturates.
package loadsource

import (
	"context"
	"fmt"
)

// A Source reads the current load in percent.
type Source interface {
	Read(ctx context.Context) (float64, error)
	String() string // what it reads, for logs and errors, e.g. "prometheus http://127.0.0.1:9100/metrics node_cpu_busy{instance=\"db1\"}"
}

var (
	_ Source = (*Prometheus)(nil)
	_ Source = (*ProcStat)(nil)
	_ Source = (*File)(nil)
)

// checkRange rejects values a limiter cannot act on; the negated comparison
// also catches NaN, which a misbehaving exporter or cron job may produce.
func checkRange(v float64) error {
	if !(v >= 0 && v <= 100) {
		return fmt.Errorf("load %g out of range 0-100", v)
	}
	return nil
}
