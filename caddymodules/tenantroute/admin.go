package tenantroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/live"
	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
)

func init() {
	caddy.RegisterModule(Admin{})
}

var registry live.Set[*TenantRoute]

func liveRoutes() []*TenantRoute { return registry.List(func(t *TenantRoute) string { return t.Name }) }

// maxTrackedTenants bounds the tenants listed in the admin API: tenant
// names come from clients.
const maxTrackedTenants = 100_000

// tenants counts live connections per tenant, for the admin API.
type tenants struct {
	mu sync.Mutex
	n  map[string]int
}

func (t *tenants) add(tenant string, d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[string]int{}
	}
	if _, ok := t.n[tenant]; !ok && (d < 0 || len(t.n) >= maxTrackedTenants) {
		return
	}
	if t.n[tenant] += d; t.n[tenant] <= 0 {
		delete(t.n, tenant)
	}
}

func (t *tenants) snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.n))
	for k, v := range t.n {
		out[k] = v
	}
	return out
}

var (
	routed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_connections_total",
		Help: "Connections routed, by handler and node.",
	}, []string{"handler", "node"})
	dialFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_dial_failures_total",
		Help: "Nodes that could not be dialled (each then cools off).",
	}, []string{"handler", "node"})
	refusedRebinds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_refused_rebinds_total",
		Help: "Connections closed for binding to a second tenant.",
	}, []string{"handler"})
	membershipStale = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "caddy_edgesteer_tenant_route_membership_stale",
		Help: "1 while etcd is unreachable and the last known members are used.",
	}, []string{"handler"})
	membershipChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_membership_changes_total",
		Help: "Changes of the node set (each re-places the tenants).",
	}, []string{"handler"})
	descOpen = prometheus.NewDesc("caddy_edgesteer_tenant_route_open_connections",
		"Connections open through the router, per node.", []string{"handler", "node"}, nil)
)

type openCollector struct{}

func (openCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descOpen }

func (openCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range liveRoutes() {
		for node, n := range t.placer.Conns() {
			ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(n), t.Name, node)
		}
	}
}

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, routed, dialFailures, refusedRebinds, membershipStale, membershipChanges, openCollector{})
}

// Admin serves /tenant_route/: GET lists every live tenant_route handler's
// members, open connections per node, partition counts and the tenants
// connected now with their nodes; POST /tenant_route/partitions with
// {"handler", "tenant", "partitions"} changes one tenant's partition count
// at run time (0 restores the default), the seed's answer to skew.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.tenant_route",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/tenant_route/", Handler: caddy.AdminHandlerFunc(serveView)},
		{Pattern: "/tenant_route/partitions", Handler: caddy.AdminHandlerFunc(servePartitions)},
	}
}

// View is one handler in the admin API's answer.
type View struct {
	Name             string              `json:"name"`
	Membership       string              `json:"membership"`
	MembershipAge    string              `json:"membership_age,omitempty"` // since etcd last answered
	MembershipError  string              `json:"membership_error,omitempty"`
	Nodes            []string            `json:"nodes"`
	OpenConnections  map[string]int64    `json:"open_connections"`
	Partitions       int                 `json:"partitions"`
	TenantPartitions map[string]int      `json:"tenant_partitions"`
	Tenants          map[string]TenantAt `json:"tenants"`
}

// TenantAt is a connected tenant: its nodes and open connections.
type TenantAt struct {
	Nodes       []string `json:"nodes"`
	Connections int      `json:"connections"`
}

func serveView(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed}
	}
	views := []View{}
	for _, t := range liveRoutes() {
		v := View{Name: t.Name, Membership: "static", Nodes: t.placer.Nodes(), OpenConnections: t.placer.Conns(),
			Partitions: t.Partitions, TenantPartitions: t.placer.Overrides(), Tenants: map[string]TenantAt{}}
		if t.etcd != nil {
			updated, lastErr := t.etcd.state()
			v.Membership, v.MembershipError = "etcd", lastErr
			if !updated.IsZero() {
				v.MembershipAge = time.Since(updated).Round(time.Millisecond).String()
			}
		}
		for tenant, n := range t.connected.snapshot() {
			v.Tenants[tenant] = TenantAt{Nodes: t.placer.Place(tenant), Connections: n}
		}
		views = append(views, v)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(views)
}

func servePartitions(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed}
	}
	var req struct {
		Handler    string `json:"handler"`
		Tenant     string `json:"tenant"`
		Partitions int    `json:"partitions"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	if req.Tenant == "" || req.Partitions < 0 {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("want a tenant and partitions ≥ 0")}
	}
	for _, t := range liveRoutes() {
		if t.Name == req.Handler {
			return t.placer.SetPartitions(req.Tenant, req.Partitions)
		}
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tenant_route handler named %q", req.Handler)}
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
