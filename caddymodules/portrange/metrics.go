package portrange

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
)

var exhausted = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "edgesteer_port_range",
	Name: "exhausted_total",
	Help: "Dials that found every tried source port of the range in use.",
}, []string{"ports"})

func registerMetrics(ctx caddy.Context) {
	_ = metricsreg.Register(ctx, exhausted)
}
