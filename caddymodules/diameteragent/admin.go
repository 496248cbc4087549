package diameteragent

import (
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("diameter_agent", func() any { return agentViews() })
}

// Admin is the admin API endpoint GET /diameter_agent/: every live
// agent's peer table, routes, groups, downstream peers, bindings and
// counts (see the README for each field).
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.diameter_agent",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/diameter_agent/", Handler: views.Handler(func() any { return agentViews() })}}
}

// AgentView is one agent in the admin API's answer.
type AgentView struct {
	Name string `json:"name"`
	diameteragent.View
}

// agentViews lists the live agents by name.
func agentViews() []AgentView {
	out := []AgentView{}
	for _, e := range liveAgents() {
		out = append(out, AgentView{Name: e.name, View: e.agent.View()})
	}
	return out
}

// liveAgents are the pool's agents, by name.
func liveAgents() []*entry {
	var out []*entry
	agents.Range(func(_, v any) bool {
		out = append(out, v.(*entry))
		return true
	})
	slices.SortFunc(out, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	return out
}

// Interface guard
var _ caddy.AdminRouter = Admin{}
