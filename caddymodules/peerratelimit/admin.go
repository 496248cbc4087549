package peerratelimit

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

func init() {
	caddy.RegisterModule(Admin{})
	views.Register("peer_rate_limit", func() any { return handlerViews() })
}

// Admin is the admin API endpoint GET /peer_rate_limit/: every live
// peer_rate_limit handler's profiles with configured and effective limits,
// the keys they track, and the live dynamic throttle level.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.peer_rate_limit",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/peer_rate_limit/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// HandlerView is one handler in the admin API's answer.
type HandlerView struct {
	Name     string        `json:"name"`
	Kind     string        `json:"kind"`
	Profiles []ProfileView `json:"profiles"`
	Dynamic  *DynamicView  `json:"dynamic,omitempty"`
}

// ProfileView is one profile.
type ProfileView struct {
	Name   string     `json:"name"`
	Keys   int        `json:"keys"`
	Limits []RuleView `json:"limits"`
}

// RuleView is one limit.
type RuleView struct {
	Name            string  `json:"name"` // "overall" or the message type
	Rate            float64 `json:"rate"`
	Burst           int     `json:"burst"`
	ThrottlePercent int     `json:"throttle_percent"`
	Effective       float64 `json:"effective_rate"`
	// EffectiveBurst is the burst at the effective rate.
	EffectiveBurst int `json:"effective_burst"`
}

// DynamicView is the dynamic controller's state.
type DynamicView struct {
	Source          string    `json:"source"`
	LoadPercent     float64   `json:"load_percent"`
	SampledAt       time.Time `json:"sampled_at,omitzero"`
	ThrottlePercent int       `json:"throttle_percent"`
	// ReversalSince is when the load went below the reversal threshold:
	// the hold in progress ends at ReversalSince + reversal_hold.
	ReversalSince time.Time `json:"reversal_since,omitzero"`
	LastError     string    `json:"last_error,omitempty"`
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(handlerViews())
}

// handlerViews is the admin API's answer (and the dashboard's).
func handlerViews() []HandlerView {
	views := []HandlerView{}
	for _, sh := range registry.List(func(sh *shared) string { return sh.name + "\x00" + sh.kind }) {
		g := sh.newest()
		if g == nil {
			continue
		}
		v := HandlerView{Name: sh.name, Kind: sh.kind}
		for _, e := range g.engines {
			pv := ProfileView{Name: e.Name, Keys: e.Keys()}
			for _, rule := range e.Rules() {
				pv.Limits = append(pv.Limits, RuleView{Name: rule.Name, Rate: rule.Rate, Burst: rule.Burst,
					ThrottlePercent: rule.Throttle(), Effective: rule.Effective(), EffectiveBurst: rule.EffectiveBurst()})
			}
			slices.SortFunc(pv.Limits, func(a, b RuleView) int { return strings.Compare(a.Name, b.Name) })
			v.Profiles = append(v.Profiles, pv)
		}
		if active, _ := sh.store.Active().(*generation); active != nil && active.dynamic != nil {
			st, _ := sh.store.Controller()
			v.Dynamic = &DynamicView{Source: active.dynamic.src.String(), LoadPercent: st.Load, SampledAt: st.SampledAt,
				ThrottlePercent: st.Throttle, ReversalSince: st.ReversalSince, LastError: active.dynamic.lastError()}
		}
		views = append(views, v)
	}
	return views
}

// Interface guards
var _ caddy.AdminRouter = Admin{}
