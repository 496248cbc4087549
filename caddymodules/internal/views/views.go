// Package views is where each edgesteer Caddy module registers the function
// that builds its admin API view, so that its admin endpoint and the
// dashboard (http.handlers.edgesteer_dashboard) show the same, documented
// JSON, read in process: the dashboard works whether or not the admin API
// listens, and wherever it listens.
package views

import (
	"slices"
	"sync"
)

var (
	mu      sync.RWMutex
	sources = map[string]func() any{}
)

// Register adds a module's view under its name ("latency_bucket"); call it
// from the module's init. The function is called concurrently, from admin
// requests and the dashboard's sampler, and must return a value that
// encodes to the JSON its README documents.
func Register(module string, view func() any) {
	mu.Lock()
	defer mu.Unlock()
	sources[module] = view
}

// Names lists the registered modules, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, 0, len(sources))
	for k := range sources {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Get builds one module's view; ok is false for a module not registered.
func Get(module string) (v any, ok bool) {
	mu.RLock()
	f := sources[module]
	mu.RUnlock()
	if f == nil {
		return nil, false
	}
	return f(), true
}
