package main

import (
	"slices"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

// Every stock directive is either registered by this build or named in
// leftOut (and then not registered), so a CoreDNS upgrade that adds a stock
// plugin fails here until plugins.go imports it or leaves it out on purpose.
// Under -tags coredns_all leftOut is empty and every directive must be there.
func TestStockPluginsRegisteredOrLeftOut(t *testing.T) {
	registered := func(d string) bool {
		_, err := caddy.DirectiveAction("dns", d)
		return err == nil
	}
	for _, d := range dnsserver.Directives {
		_, out := leftOut[d]
		switch in := registered(d); {
		case in && out:
			t.Errorf("%s is registered but listed in leftOut", d)
		case !in && !out:
			t.Errorf("stock directive %s is neither registered nor listed in leftOut", d)
		}
	}
	for d := range leftOut {
		if !slices.Contains(dnsserver.Directives, d) {
			t.Errorf("leftOut names %s, which is no stock directive", d)
		}
	}
	for _, p := range edgesteerPlugins {
		if !registered(p.Name) {
			t.Errorf("edgesteer plugin %s is not registered", p.Name)
		}
	}
}
