package cacheredirect

import (
	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgesteer/edgesteer/caddymodules/internal/live"
	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	"github.com/edgesteer/edgesteer/internal/cacheroute"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("cache_redirect", func() any { return nodeViews() })
}

// handlers are the provisioned cache_redirect handlers of loaded configs.
var handlers live.Set[*CacheRedirect]

// paths are the request paths, in the order the view lists them.
var paths = []string{cacheroute.PathCache, cacheroute.PathBypass, cacheroute.PathMiss, cacheroute.PathFallback}

// Admin is the admin API endpoint GET /cache_redirect/: per lower-tier
// node, the requests by path, the forged client IP headers replaced, and
// each cache's availability.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.cache_redirect",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/cache_redirect/", Handler: views.Handler(nodeViews)}}
}

// NodeView is one node (the handlers of that node name) in the answer.
type NodeView struct {
	Node                string            `json:"node"`
	ClientIPHeader      string            `json:"client_ip_header"`
	Caches              []CacheView       `json:"caches"`
	Origin              []string          `json:"origin"`
	RequestsTotal       map[string]uint64 `json:"requests_total"`
	ForgedClientIPTotal uint64            `json:"forged_client_ip_total"`
}

// CacheView is one cache server.
type CacheView struct {
	Address string `json:"address"`
	Up      bool   `json:"up"`
}

// counterValue reads one counter of the process's metrics.
func counterValue(c interface{ Write(*dto.Metric) error }) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return uint64(m.Counter.GetValue())
}

// nodeViews is the admin API's answer (and the dashboard's): the counters
// are the process's since it started (those of the metrics endpoint), by
// node name; with several live handlers of one node (during a reload),
// the caches listed are one handler's.
func nodeViews() []NodeView {
	out := []NodeView{}
	seen := map[string]bool{}
	for _, c := range handlers.List(func(c *CacheRedirect) string { return c.Node }) {
		if seen[c.Node] {
			continue
		}
		seen[c.Node] = true
		v := NodeView{Node: c.Node, ClientIPHeader: c.ClientIPHeader, Origin: c.Origin,
			RequestsTotal: map[string]uint64{}, ForgedClientIPTotal: counterValue(forgedTotal.WithLabelValues(c.Node))}
		for _, p := range paths {
			v.RequestsTotal[p] = counterValue(requestsTotal.WithLabelValues(c.Node, p))
		}
		for _, u := range c.cache.Upstreams {
			v.Caches = append(v.Caches, CacheView{Address: u.Dial, Up: u.Available()})
		}
		out = append(out, v)
	}
	return out
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
