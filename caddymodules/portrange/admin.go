package portrange

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/live"
	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("port_range", func() any { return transportViews() })
}

// transports are the provisioned port_range transports of loaded configs.
var transports live.Set[*Transport]

// Admin is the admin API endpoint GET /port_range/: each live port_range
// transport's source port range and how much of it the host's sockets
// hold (in use, TIME_WAIT), with the dialer's counters.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.port_range",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/port_range/", Handler: views.Handler(transportViews)}}
}

// TransportView is one transport in the admin API's answer.
type TransportView struct {
	Node           string `json:"node,omitempty"`
	Ports          string `json:"ports"`
	Size           int    `json:"size"`
	LocalIP        string `json:"local_ip,omitempty"`
	USIP           bool   `json:"usip"`
	PortsInUse     int    `json:"ports_in_use"`
	TimeWait       int    `json:"time_wait"`
	SkippedTotal   uint64 `json:"skipped_total"`
	ExhaustedTotal uint64 `json:"exhausted_total"`
	Error          string `json:"error,omitempty"`
}

// transportViews is the admin API's answer (and the dashboard's).
func transportViews() []TransportView {
	out := []TransportView{}
	for _, t := range transports.List(func(t *Transport) string { return t.Node + " " + t.dialer.Ports.String() }) {
		d := t.dialer
		v := TransportView{Node: t.Node, Ports: d.Ports.String(), Size: d.Ports.Size(), USIP: t.USIP,
			SkippedTotal: d.Skipped.Load(), ExhaustedTotal: d.Exhausted.Load()}
		if d.LocalIP.IsValid() {
			v.LocalIP = d.LocalIP.String()
		}
		u, err := d.Ports.HostUsage()
		v.PortsInUse, v.TimeWait = u.InUse, u.TimeWait
		if err != nil {
			v.Error = err.Error()
		}
		out = append(out, v)
	}
	return out
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
