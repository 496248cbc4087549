// Package diameteragent provides the layer4.handlers.diameter_agent
// handler: a Diameter relay agent (routing by realm and application to
// peer groups, session binding, failover, ingress and egress limits).
// The agent is internal/diameteragent; this package hands it accepted
// connections and keeps it, under the handler's name, across reloads.
package diameteragent

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
	"github.com/edgesteer/edgesteer/internal/olrshare"
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
	// DOIC turns on overload control and load information (RFC 7683,
	// 8581, 8583); absent, those AVPs pass through untouched.
	DOIC *DOICConfig `json:"doic,omitempty"`

	Watchdog             caddy.Duration `json:"watchdog,omitempty"`      // Tw, default 30s, at least 6s
	ReconnectMin         caddy.Duration `json:"reconnect_min,omitempty"` // default 1s
	ReconnectMax         caddy.Duration `json:"reconnect_max,omitempty"` // default 30s
	MaxBindings          int            `json:"max_bindings,omitempty"`  // default 1000000
	BindingTTL           caddy.Duration `json:"binding_ttl,omitempty"`   // default 1h
	ServerRequestTimeout caddy.Duration `json:"server_request_timeout,omitempty"`
	MaxLength            int            `json:"max_length,omitempty"` // default 65536

	// BindingStore shares the bindings with the agent's other replicas
	// (cluster.go; default: none, local only).
	BindingStore *BindingStoreConfig `json:"binding_store,omitempty"`

	store   *diambind.Config
	reports *olrshare.Config // the DOIC reports' shared level: with doic and binding_store
	entry   *entry
	install *install
}

// entry is the agent kept in the pool under a handler's name.
type entry struct {
	name  string
	agent *diameteragent.Agent

	mu sync.Mutex
	// live are the configurations installed in the agent whose Caddy
	// config still runs, oldest first; the last is the agent's.
	live []*install
}

// install is one handler's configuration of an agent.
type install struct {
	entry    *entry
	cfg      diameteragent.Config
	profiles profileCache // its limits, so an unchanged one keeps its buckets
	fresh    bool         // it made the agent, which is not started yet
}

func (e *entry) Destruct() error {
	e.agent.Close()
	return nil
}

// currentProfiles returns the limits of the configuration the agent runs.
func (e *entry) currentProfiles() profileCache {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.live) == 0 {
		return nil
	}
	return e.live[len(e.live)-1].profiles
}

// apply installs in when its Caddy config starts.
func (e *entry) apply(in *install) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if in.fresh {
		e.agent.Start()
	} else if err := e.agent.Update(in.cfg); err != nil {
		return fmt.Errorf("diameter_agent %s: %w", e.name, err)
	}
	e.live = append(e.live, in)
	return nil
}

// release forgets in, its Caddy config going away. When in is the
// agent's and an older config still runs, in's config failed to start
// after it was installed: the agent goes back to the older one.
func (e *entry) release(in *install) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.Index(e.live, in)
	if i < 0 {
		return // never installed: its config failed before starting
	}
	e.live = slices.Delete(e.live, i, i+1)
	if i == len(e.live) && i > 0 {
		e.agent.Update(e.live[i-1].cfg) // was installed before: cannot fail
	}
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

// Provision builds the configuration and checks it. It changes no
// running agent: the config's installer (the diameter_agent app) installs
// it when the whole config starts, so a config that fails to load leaves
// each agent on the configuration it had. A name new to the process makes
// its agent here, connected only when the config starts.
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
	if err := h.provisionBindingStore(ctx); err != nil {
		return err
	}
	app, err := ctx.App(installerID)
	if err != nil {
		return err
	}
	inst := app.(*installer)
	if inst.claimed[h.Name] {
		return fmt.Errorf("diameter_agent: name %q: given to two handlers of one config; each agent needs its own name", h.Name)
	}
	inst.claimed[h.Name] = true
	var made *install
	val, loaded, err := agents.LoadOrNew(h.Name, func() (caddy.Destructor, error) {
		made = &install{profiles: profileCache{}, fresh: true}
		cfg, err := h.engineConfig(nil, made.profiles)
		if err != nil {
			return nil, err
		}
		a, err := diameteragent.New(cfg, diameteragent.Options{Logger: ctx.Slogger()})
		if err != nil {
			return nil, fmt.Errorf("diameter_agent %s: %w", h.Name, err)
		}
		made.cfg = cfg
		return &entry{name: h.Name, agent: a}, nil
	})
	if err != nil {
		return err
	}
	e := val.(*entry)
	h.entry = e
	if !loaded {
		made.entry = e
		h.install = made
		inst.pending = append(inst.pending, made)
		return nil
	}
	in := &install{entry: e, profiles: profileCache{}}
	if in.cfg, err = h.engineConfig(e.currentProfiles(), in.profiles); err == nil {
		err = diameteragent.Check(in.cfg)
	}
	if err != nil {
		return fmt.Errorf("diameter_agent %s: %w", h.Name, err)
	}
	h.install = in
	inst.pending = append(inst.pending, in)
	return nil
}

// Handle hands the connection to the agent; it returns when the
// connection ends.
func (h *Handler) Handle(cx *layer4.Connection, _ layer4.Handler) error {
	return h.entry.agent.Serve(cx)
}

// Cleanup releases the agent; the last config using its name closes it
// (a DPR to each peer). A config that installed its configuration and
// fails to start puts the agent back on the one before.
func (h *Handler) Cleanup() error {
	if h.entry == nil {
		return nil
	}
	if h.install != nil {
		h.entry.release(h.install)
	}
	_, err := agents.Delete(h.Name)
	return err
}

// Interface guards
var (
	_ layer4.NextHandler = (*Handler)(nil)
	_ caddy.Provisioner  = (*Handler)(nil)
	_ caddy.CleanerUpper = (*Handler)(nil)
)
