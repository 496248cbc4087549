package ntier

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	engine "github.com/edgesteer/edgesteer/internal/ntier"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("ntier", func() any { return dashboardView() })
}

// dashboardView is the view as the dashboard and GET /edgesteer/views carry
// it: every module's view there is an array, so this one is [] when
// neither role is configured and [GET /ntier/'s answer] otherwise.
func dashboardView() []View {
	if v := view(); v.Upper != nil || v.Lower != nil {
		return []View{v}
	}
	return []View{}
}

// Admin is the admin API endpoint GET /ntier/: the upper tier's nodes,
// their health and buckets, and the lower node's installed rule set.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.ntier", New: func() caddy.Module { return new(Admin) }}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/ntier/", Handler: views.Handler(func() any { return view() })}}
}

// View is the admin API's answer.
type View struct {
	Upper *engine.View `json:"upper,omitempty"`
	Lower *LowerView   `json:"lower,omitempty"`
}

// LowerView is a lower node's installed interception.
type LowerView struct {
	Table      string   `json:"table"`
	Ports      []string `json:"ports"`
	ListenPort uint16   `json:"listen_port"`
	Mark       uint32   `json:"mark"`
	IPVersions []int    `json:"ip_versions"`
}

// view reads the pooled state of both roles.
func view() View {
	var v View
	pool.Range(func(_, value any) bool {
		switch s := value.(type) {
		case *upperState:
			uv := s.ctl.View()
			v.Upper = &uv
		case *lowerState:
			s.mu.Lock()
			lv := &LowerView{Table: s.rs.Table, ListenPort: s.rs.Tproxy, Ports: []string{}, IPVersions: []int{}}
			if s.rs.IPv4 {
				lv.IPVersions = append(lv.IPVersions, 4)
			}
			if s.rs.IPv6 {
				lv.IPVersions = append(lv.IPVersions, 6)
			}
			for _, p := range s.rs.Ports {
				lv.Ports = append(lv.Ports, p.String())
			}
			if len(s.rs.Routes) > 0 {
				lv.Mark = s.rs.Routes[0].Mark
			}
			s.mu.Unlock()
			v.Lower = lv
		}
		return true
	})
	return v
}

// collector exports the upper tier's state at scrape time, from the same
// view as the admin API.
type collector struct{}

var (
	upDesc = prometheus.NewDesc("caddy_edgesteer_ntier_node_up",
		"1 while the upper tier's health checks find the lower node up.", []string{"node"}, nil)
	bucketsDesc = prometheus.NewDesc("caddy_edgesteer_ntier_buckets",
		"Hash buckets of client addresses the lower node serves now.", []string{"node"}, nil)
	probesDesc = prometheus.NewDesc("caddy_edgesteer_ntier_probes_total",
		"Health checks of the lower node.", []string{"node"}, nil)
	installedDesc = prometheus.NewDesc("caddy_edgesteer_ntier_installed",
		"1 while the upper tier's rules are installed.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{upDesc, bucketsDesc, probesDesc, installedDesc} {
		ch <- d
	}
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	u := view().Upper
	if u == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(installedDesc, prometheus.GaugeValue, b2f(u.Installed))
	for _, n := range u.Nodes {
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, b2f(n.Up), n.Name)
		ch <- prometheus.MustNewConstMetric(bucketsDesc, prometheus.GaugeValue, float64(n.Serving), n.Name)
		ch <- prometheus.MustNewConstMetric(probesDesc, prometheus.CounterValue, float64(n.ProbedTotal), n.Name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Interface guards
var (
	_ caddy.AdminRouter    = Admin{}
	_ prometheus.Collector = collector{}
)
