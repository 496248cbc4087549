package cacheredirect

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
)

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "edgesteer_cache_redirect",
		Name: "requests_total",
		Help: "Requests by lower-tier node and path (cache, bypass, miss, fallback).",
	}, []string{"node", "path"})
	forgedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "edgesteer_cache_redirect",
		Name: "forged_client_ip_total",
		Help: "Requests from untrusted peers that carried the client IP header (replaced).",
	}, []string{"node"})
)

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, requestsTotal, forgedTotal)
}
