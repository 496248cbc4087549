// Package diameteragent provides the layer4.handlers.diameter_agent
// handler: a Diameter relay agent (routing by realm and application to
// peer groups, session binding, failover, ingress and egress limits).
// The agent is internal/diameteragent; this package hands it accepted
// connections and keeps it, under the handler's name, across reloads.
package diameteragent

import (
	"fmt"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler terminates each downstream Diameter connection it is given and
// hands it to the agent named Name. It is a terminal handler: the
// connection is the agent's until it ends.
type Handler struct {
	// Name keys the agent kept across reloads (default: origin_host). Two
	// handlers with one name in a config are an error.
	Name string `json:"name,omitempty"`

	OriginHost      string   `json:"origin_host"`
	OriginRealm     string   `json:"origin_realm"`
	HostIPAddresses []string `json:"host_ip_addresses"`
	VendorID        uint32   `json:"vendor_id,omitempty"`
	ProductName     string   `json:"product_name,omitempty"` // default "edgesteer"
	// Applications the agent advertises and routes.
	Applications []diameteragent.Application `json:"applications"`

	Peers        []PeerConfig  `json:"peers,omitempty"`
	Groups       []GroupConfig `json:"groups,omitempty"`
	Routes       []RouteConfig `json:"routes,omitempty"`
	DefaultGroup string        `json:"default_group,omitempty"`

	// Ingress limits requests per downstream peer (its CER's Origin-Host)
	// and message type, before routing.
	Ingress *LimitConfig `json:"ingress,omitempty"`

	Watchdog             caddy.Duration `json:"watchdog,omitempty"`      // Tw, default 30s, at least 6s
	ReconnectMin         caddy.Duration `json:"reconnect_min,omitempty"` // default 1s
	ReconnectMax         caddy.Duration `json:"reconnect_max,omitempty"` // default 30s
	MaxBindings          int            `json:"max_bindings,omitempty"`  // default 1000000
	BindingTTL           caddy.Duration `json:"binding_ttl,omitempty"`   // default 1h
	ServerRequestTimeout caddy.Duration `json:"server_request_timeout,omitempty"`
	MaxLength            int            `json:"max_length,omitempty"` // default 65536

	entry *entry
}

// entry is the agent kept in the pool under a handler's name.
type entry struct {
	name  string
	agent *diameteragent.Agent

	mu       sync.Mutex
	profiles profileCache // the current generation's limits
	loadedBy *caddy.Context
}

func (e *entry) Destruct() error {
	e.agent.Close()
	return nil
}

// agents holds one agent per name while a config uses it.
var agents = caddy.NewUsagePool()

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.diameter_agent",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision builds the configuration and installs it in the agent kept
// under the handler's name (made and connected upstream on first use).
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := registerMetrics(ctx); err != nil {
		return err
	}
	if h.Name == "" {
		h.Name = strings.ToLower(h.OriginHost)
	}
	if h.Name == "" {
		return fmt.Errorf("diameter_agent: origin_host: required")
	}
	profiles := profileCache{}
	var cfg diameteragent.Config
	var buildErr error
	val, loaded, err := agents.LoadOrNew(h.Name, func() (caddy.Destructor, error) {
		if cfg, buildErr = h.engineConfig(nil, profiles); buildErr != nil {
			return nil, buildErr
		}
		a, err := diameteragent.New(cfg, diameteragent.Options{
			Logger: ctx.Slogger()})
		if err != nil {
			return nil, fmt.Errorf("diameter_agent %s: %w", h.Name, err)
		}
		a.Start()
		return &entry{name: h.Name, agent: a, profiles: profiles, loadedBy: &ctx}, nil
	})
	if err != nil {
		return err
	}
	e := val.(*entry)
	if loaded {
		if err := h.update(ctx, e); err != nil {
			agents.Delete(h.Name)
			return err
		}
	}
	h.entry = e
	return nil
}

// update installs h's configuration in an agent a previous config made.
func (h *Handler) update(ctx caddy.Context, e *entry) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loadedBy != nil && e.loadedBy.Context == ctx.Context {
		return fmt.Errorf("diameter_agent: name %q: given to two handlers of one config; each agent needs its own name", h.Name)
	}
	profiles := profileCache{}
	cfg, err := h.engineConfig(e.profiles, profiles)
	if err != nil {
		return err
	}
	if err := e.agent.Update(cfg); err != nil {
		return fmt.Errorf("diameter_agent %s: %w", h.Name, err)
	}
	e.profiles, e.loadedBy = profiles, &ctx
	return nil
}

// Handle hands the connection to the agent; it returns when the
// connection ends.
func (h *Handler) Handle(cx *layer4.Connection, _ layer4.Handler) error {
	return h.entry.agent.Serve(cx)
}

// Cleanup releases the agent; the last config using its name closes it
// (a DPR to each server, downstream connections closed).
func (h *Handler) Cleanup() error {
	if h.entry != nil {
		_, err := agents.Delete(h.Name)
		return err
	}
	return nil
}

// Interface guards
var (
	_ layer4.NextHandler = (*Handler)(nil)
	_ caddy.Provisioner  = (*Handler)(nil)
	_ caddy.CleanerUpper = (*Handler)(nil)
)
