package tenantroute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/metricsreg"
	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("tenant_route", func() any { return handlerViews() })
}

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

func (t *tenants) get(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[tenant]
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
	unanswered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_unanswered_total",
		Help: "Nodes that took a connection but did not answer its first message within first_response_timeout (each then cools off).",
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
	for _, s := range liveStates() {
		for node, n := range s.placer.Conns() {
			ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(n), s.name, node)
		}
	}
}

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, routed, dialFailures, unanswered, refusedRebinds, membershipStale, membershipChanges, openCollector{})
}

// Admin serves /tenant_route/: GET lists every live tenant_route handler's
// members, open connections per node, partition counts and the tenants
// connected now with their nodes; POST /tenant_route/partitions with
// {"handler", "tenant", "partitions"} changes one tenant's partition count
// at run time (0 clears it: back to the config's count), the seed's answer
// to skew. A run-time count lasts across reloads (see the README).
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
		{Pattern: "/tenant_route/placement", Handler: caddy.AdminHandlerFunc(servePlacement)},
	}
}

// View is one handler name in the admin API's answer. It is the process
// state kept under that name, so it spans reloads: connections routed by
// an earlier config generation and still open are counted.
type View struct {
	Name       string `json:"name"`
	Membership string `json:"membership"`
	// MembershipUpdated (RFC 3339) is when etcd last answered, and
	// MembershipAgeMS how long ago; both absent with static membership.
	MembershipUpdated string   `json:"membership_updated,omitempty"`
	MembershipAgeMS   *int64   `json:"membership_age_ms,omitempty"`
	MembershipError   string   `json:"membership_error,omitempty"`
	Nodes             []string `json:"nodes"`
	// OpenConnections per node; a node removed from the members stays
	// listed while connections to it are open.
	OpenConnections map[string]int64 `json:"open_connections"`
	Partitions      int              `json:"partitions"`
	// TenantPartitions are the tenants with their own count, from the
	// config or set at run time; RuntimePartitions only the latter.
	TenantPartitions  map[string]int      `json:"tenant_partitions"`
	RuntimePartitions map[string]int      `json:"runtime_partitions"`
	Tenants           map[string]TenantAt `json:"tenants"`
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
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(handlerViews())
}

// handlerViews is the admin API's answer (and the dashboard's).
func handlerViews() []View {
	views := []View{}
	for _, s := range liveStates() {
		p := s.placer
		v := View{Name: s.name, Membership: "static", Nodes: p.Nodes(), OpenConnections: p.Conns(),
			Partitions: p.DefaultPartitions(), TenantPartitions: p.Overrides(), RuntimePartitions: p.RuntimeOverrides(),
			Tenants: map[string]TenantAt{}}
		if w := s.watcher.Load(); w != nil {
			updated, lastErr := w.state()
			v.Membership, v.MembershipError = "etcd", lastErr
			if !updated.IsZero() {
				age := time.Since(updated).Milliseconds()
				v.MembershipUpdated, v.MembershipAgeMS = updated.UTC().Format(time.RFC3339Nano), &age
			}
		}
		for tenant, n := range s.connected.snapshot() {
			v.Tenants[tenant] = TenantAt{Nodes: p.Place(tenant), Connections: n}
		}
		views = append(views, v)
	}
	return views
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
	for _, s := range liveStates() {
		if s.name == req.Handler {
			if err := s.placer.SetPartitions(req.Tenant, req.Partitions); err != nil {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
			}
			if w := s.watcher.Load(); w != nil {
				w.republish() // the tenant's assignment changed
			}
			return nil
		}
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tenant_route handler named %q", req.Handler)}
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
