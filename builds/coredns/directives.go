package main

import (
	"fmt"
	"slices"
)

// directive places one edgesteer plugin in CoreDNS's plugin chain: it runs
// immediately before the stock plugin named in Before.
type directive struct {
	Name   string
	Before string
}

// edgesteerPlugins lists every plugin under corednsplugins/, in chain order.
// Each one also needs its blank import in main.go.
//
// Where they go, and why: edgesteer plugins answer per client location, so
// they run after acl and rewrite (access rules and name rewrites apply to
// them as to any stock answer) and before cache, whose entries are keyed by
// name and type only and would otherwise hand one location's answer to every
// other. The stock loadbalance plugin runs earlier in the chain and shuffles
// whatever answers pass through it, so do not combine it with an ordering
// plugin in the same server block.
var edgesteerPlugins = []directive{
	{Name: "ogs", Before: "cache"},
}

// withEdgesteer returns a copy of the stock directive list with each plugin
// inserted before its anchor.
func withEdgesteer(stock []string, plugins []directive) ([]string, error) {
	out := slices.Clone(stock)
	for _, p := range plugins {
		if slices.Contains(out, p.Name) {
			return nil, fmt.Errorf("plugin %q is already in the directive list", p.Name)
		}
		i := slices.Index(out, p.Before)
		if i < 0 {
			return nil, fmt.Errorf("plugin %q: anchor directive %q is not in the list", p.Name, p.Before)
		}
		out = slices.Insert(out, i, p.Name)
	}
	return out, nil
}
