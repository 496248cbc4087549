// Package redisstore is the Caddy app edgesteer_redis: the Redis
// connections edgesteer's Caddy modules share, each declared once by name
// and referenced by that name from a module (peer_rate_limit's cluster,
// latency_bucket's sticky_store). A client lives across config reloads
// while its config is unchanged (a caddy.UsagePool keyed by name and
// config, held in redisconn's process-wide pool that CoreDNS's ogs uses
// too), so a reload does not reconnect.
package redisstore

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/redisconn"
)

// AppName is the app's module ID and the key in Caddy's JSON "apps".
const AppName = "edgesteer_redis"

func init() {
	caddy.RegisterModule(App{})
}

// App holds the named Redis connections.
type App struct {
	// Stores maps a name, referenced by the modules, to a connection.
	Stores map[string]*redisconn.Config `json:"stores,omitempty"`

	conns map[string]*Conn
}

// Conn is one named connection as the modules use it.
type Conn struct {
	Name    string
	Config  redisconn.Config // with defaults filled
	Client  redis.UniversalClient
	release func()
}

// Key is the key namespace of a module's policy or profile:
// "<key_prefix>:<module>:<name>".
func (c *Conn) Key(module, name string) string { return c.Config.Key(module, name) }

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: AppName, New: func() caddy.Module { return new(App) }}
}

// Provision validates every store and gets its client.
func (a *App) Provision(ctx caddy.Context) error {
	a.conns = map[string]*Conn{}
	for _, name := range slices.Sorted(maps.Keys(a.Stores)) {
		if name == "" || strings.ContainsAny(name, " \t{}") {
			return fmt.Errorf("%s: store name %q: want a word without spaces or braces", AppName, name)
		}
		cfg := *a.Stores[name]
		cfg.FillDefaults()
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("%s %s: %v", AppName, name, err)
		}
		client, release, err := redisconn.Acquire(name, &cfg)
		if err != nil {
			return fmt.Errorf("%s %s: %v", AppName, name, err)
		}
		a.conns[name] = &Conn{Name: name, Config: cfg, Client: client, release: release}
	}
	return nil
}

// Start does nothing: clients connect on first use.
func (a *App) Start() error { return nil }

// Stop does nothing: Cleanup releases the clients.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's hold on its clients; a client closes when
// no loaded config uses it.
func (a *App) Cleanup() error {
	for _, c := range a.conns {
		c.release()
	}
	return nil
}

// Lookup returns the named connection of the config being provisioned;
// module names the caller in the error ("peer_rate_limit: cluster").
func Lookup(ctx caddy.Context, module, name string) (*Conn, error) {
	v, err := ctx.App(AppName)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", module, err)
	}
	a := v.(*App)
	c, ok := a.conns[name]
	if !ok {
		known := slices.Sorted(maps.Keys(a.conns))
		if len(known) == 0 {
			return nil, fmt.Errorf("%s: no Redis store named %q: declare it with the %s global option (Caddyfile) or apps.%s.stores (JSON)",
				module, name, AppName, AppName)
		}
		return nil, fmt.Errorf("%s: no Redis store named %q (declared: %s)", module, name, strings.Join(known, ", "))
	}
	return c, nil
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
