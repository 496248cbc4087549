// Package metricsreg registers process-wide Prometheus collectors with the
// registry of each Caddy config load: a reload registers them again, which
// is no error.
package metricsreg

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// Register adds the collectors to ctx's metrics registry, if it has one.
func Register(ctx caddy.Context, collectors ...prometheus.Collector) error {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
