package dashboard

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API endpoint GET /edgesteer/views: every registered
// module view of this Caddy in one object, by module name. Another
// replica's dashboard lists this Caddy's admin address under `replicas`
// and reads it, so one page shows processes that run no dashboard (the
// N-tier nodes, a separate LDAP router).
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.edgesteer_views",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/edgesteer/views", Handler: views.Handler(allViews)}}
}

// allViews is every registered view, marshalled.
func allViews() map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for _, name := range views.Names() {
		if v, ok := views.Get(name); ok {
			if b, err := json.Marshal(v); err == nil {
				out[name] = b
			}
		}
	}
	return out
}

// Interface guard
var _ caddy.AdminRouter = Admin{}
