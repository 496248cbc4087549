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
	"github.com/edgesteer/edgesteer/internal/placement"
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
	busyRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_busy_refusals_total",
		Help: "Connections refused with LDAP busy (51): every node of the tenant at max_per_node.",
	}, []string{"handler"})
	failedBinds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_failed_binds_total",
		Help: "Binds the node answered with an error (the connection stops counting as load).",
	}, []string{"handler"})
	failedBindCloses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_failed_bind_closes_total",
		Help: "Connections closed after max_failed_binds failed binds.",
	}, []string{"handler"})
	relays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_edgesteer_tenant_route_relays_total",
		Help: "Routed connections by how they are relayed: handed_over (to the epoll relay; no goroutine while idle) or in_place (a wrapper such as TLS or PROXY protocol, bytes read ahead, or no descriptor to spare).",
	}, []string{"handler", "mode"})
	descPartitions = prometheus.NewDesc("caddy_edgesteer_tenant_route_partitions",
		"Partition count of each tenant above the handler's default (auto partitions, tenant_partitions or run time).",
		[]string{"handler", "tenant"}, nil)
	descChanges = prometheus.NewDesc("caddy_edgesteer_tenant_route_partition_changes_total",
		"Partition count changes by auto partitions, by direction (grow, shrink).", []string{"handler", "direction"}, nil)
	descOpen = prometheus.NewDesc("caddy_edgesteer_tenant_route_open_connections",
		"Connections open through the router, per node.", []string{"handler", "node"}, nil)
)

type openCollector struct{}

func (openCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOpen
	ch <- descPartitions
	ch <- descChanges
}

func (openCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range liveStates() {
		for node, n := range s.placer.Conns() {
			ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(n), s.name, node)
		}
		for tenant, k := range abovePartitions(s.placer) {
			ch <- prometheus.MustNewConstMetric(descPartitions, prometheus.GaugeValue, float64(k), s.name, tenant)
		}
		c := s.placer.Counters()
		ch <- prometheus.MustNewConstMetric(descChanges, prometheus.CounterValue, float64(c.Grown), s.name, "grow")
		ch <- prometheus.MustNewConstMetric(descChanges, prometheus.CounterValue, float64(c.Shrunk), s.name, "shrink")
	}
}

// abovePartitions lists the tenants whose k is above the default: grown by
// auto partitions (tenants with authenticated load), or with their own
// count in the config or set at run time.
func abovePartitions(p *placement.Placer) map[string]int {
	def := p.DefaultPartitions()
	out := map[string]int{}
	for tenant, k := range p.Overrides() {
		if k > def {
			out[tenant] = k
		}
	}
	for tenant, k := range p.Grown() {
		if k > def {
			out[tenant] = k
		}
	}
	return out
}

func registerMetrics(ctx caddy.Context) error {
	return metricsreg.Register(ctx, routed, dialFailures, unanswered, refusedRebinds, membershipStale, membershipChanges,
		busyRefusals, failedBinds, failedBindCloses, relays, openCollector{})
}

// Admin serves /tenant_route/: GET lists every live tenant_route handler's
// members, open connections per node, partition counts and the tenants
// connected now with their nodes; POST /tenant_route/partitions with
// {"handler", "tenant", "partitions"} changes one tenant's partition count
// at run time (0 clears it: back to the config's count): an operator gives a
// hot tenant more nodes without a reload. A run-time count lasts across
// reloads (see the README).
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
		{Pattern: "/tenant_route/", Handler: views.Handler(handlerViews)},
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
	// AutoPartitions is the rule in force (nil: off); MaxPerNode the
	// per-node ceiling (0: none).
	AutoPartitions *AutoView `json:"auto_partitions"`
	MaxPerNode     int       `json:"max_per_node"`
	// PartitionChanges counts auto partitions' steps by direction.
	PartitionChanges           map[string]uint64 `json:"partition_changes"`
	BusyRefusals               uint64            `json:"busy_refusals"`
	UnauthenticatedConnections int64             `json:"unauthenticated_connections"`
	// FailedBinds per tenant, for the most recent maxFailedTenants tenants.
	FailedBinds map[string]uint64 `json:"failed_binds"`
	// PartitionHistory is the last placement.HistoryLength changes by auto
	// partitions, oldest first.
	PartitionHistory []ChangeView `json:"partition_history"`
	// TenantSizes is the sizes file in use (nil: none).
	TenantSizes *SizesView `json:"tenant_sizes,omitempty"`
}

// AutoView is auto_partitions as configured (0: that trigger is off).
type AutoView struct {
	TargetPerNode         int     `json:"target_per_node"`
	ShareFactor           float64 `json:"share_factor"`
	TargetRequestsPerNode float64 `json:"target_requests_per_second_per_node"`
	Max                   int     `json:"max"`
	CoolDownMS            int64   `json:"cool_down_ms"`
}

// ChangeView is one partition change by auto partitions.
type ChangeView struct {
	Time      string `json:"time"` // RFC 3339
	Tenant    string `json:"tenant"`
	Direction string `json:"direction"` // grow or shrink
	From      int    `json:"from"`
	To        int    `json:"to"`
	Reason    string `json:"reason"`
}

// TenantAt is a connected tenant: its nodes and open connections, and its
// partition count with the last change auto partitions made to it.
type TenantAt struct {
	Nodes                    []string `json:"nodes"`
	Connections              int      `json:"connections"`
	AuthenticatedConnections int      `json:"authenticated_connections"`
	Partitions               int      `json:"partitions"`
	PartitionsChanged        string   `json:"partitions_changed,omitempty"`
	PartitionsChangeReason   string   `json:"partitions_change_reason,omitempty"`
	PartitionsChangeDir      string   `json:"partitions_change_direction,omitempty"`
	// RequestsPerSecond is its client messages per second (after each
	// connection's first) over the last whole second, on connections that
	// count as load.
	RequestsPerSecond float64 `json:"requests_per_second"`
}

// handlerViews is the admin API's answer (and the dashboard's).
func handlerViews() []View {
	views := []View{}
	for _, s := range liveStates() {
		p := s.placer
		v := View{Name: s.name, Membership: "static", Nodes: p.Nodes(), OpenConnections: p.Conns(),
			Partitions: p.DefaultPartitions(), TenantPartitions: p.Overrides(), RuntimePartitions: p.RuntimeOverrides(),
			Tenants: map[string]TenantAt{}}
		if w := s.sizes.Load(); w != nil {
			v.TenantSizes = w.view()
		}
		if w := s.watcher.Load(); w != nil {
			updated, lastErr := w.health()
			v.Membership, v.MembershipError = "etcd", lastErr
			if !updated.IsZero() {
				age := time.Since(updated).Milliseconds()
				v.MembershipUpdated, v.MembershipAgeMS = updated.UTC().Format(time.RFC3339Nano), &age
			}
		}
		loads := p.Loads()
		for tenant, n := range s.connected.snapshot() {
			at := TenantAt{Nodes: p.Place(tenant), Connections: n}
			at.Partitions = len(at.Nodes)
			if l, ok := loads[tenant]; ok {
				at.AuthenticatedConnections, at.RequestsPerSecond = l.Authenticated, l.RequestsPerSecond
				if !l.Changed.IsZero() {
					at.PartitionsChanged = l.Changed.UTC().Format(time.RFC3339Nano)
					at.PartitionsChangeReason, at.PartitionsChangeDir = l.Reason, "shrink"
					if l.Grew {
						at.PartitionsChangeDir = "grow"
					}
				}
			}
			v.Tenants[tenant] = at
		}
		auto, maxPerNode := p.AutoConfig()
		if auto != nil {
			v.AutoPartitions = &AutoView{TargetPerNode: auto.TargetPerNode, ShareFactor: auto.ShareFactor,
				TargetRequestsPerNode: auto.TargetRequestsPerNode, Max: auto.Max, CoolDownMS: auto.CoolDown.Milliseconds()}
		}
		v.PartitionHistory = []ChangeView{}
		for _, ch := range p.History() {
			dir := "shrink"
			if ch.Grew {
				dir = "grow"
			}
			v.PartitionHistory = append(v.PartitionHistory, ChangeView{Time: ch.Time.UTC().Format(time.RFC3339Nano),
				Tenant: ch.Tenant, Direction: dir, From: ch.From, To: ch.To, Reason: ch.Reason})
		}
		c := p.Counters()
		v.MaxPerNode, v.BusyRefusals, v.UnauthenticatedConnections = maxPerNode, c.BusyRefusals, c.Unauthenticated
		v.PartitionChanges = map[string]uint64{"grow": c.Grown, "shrink": c.Shrunk}
		v.FailedBinds = s.failed.Counts()
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
