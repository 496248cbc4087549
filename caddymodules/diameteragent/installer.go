package diameteragent

import (
	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(installer{})
}

// installerID is the installer app's module ID.
const installerID = "diameter_agent"

// installer is a Caddy app that a config's diameter_agent handlers load
// (it is never configured by hand): when the config starts, it installs
// in each agent the configuration its handler provisioned, and starts the
// agents the config made. A config that fails before it starts changes
// no running agent.
type installer struct {
	pending []*install
	claimed map[string]bool // agent names given to a handler of this config
}

// CaddyModule returns the Caddy module information.
func (installer) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  installerID,
		New: func() caddy.Module { return &installer{claimed: map[string]bool{}} },
	}
}

// Start installs the configurations of the config's handlers.
func (i *installer) Start() error {
	for _, in := range i.pending {
		if err := in.entry.apply(in); err != nil {
			return err
		}
	}
	return nil
}

// Stop does nothing: a config going away releases its agents in its
// handlers' Cleanup.
func (i *installer) Stop() error { return nil }

// Interface guards
var _ caddy.App = (*installer)(nil)
