//go:build coredns_all

package main

// Built with -tags coredns_all, bin/coredns carries every stock CoreDNS
// plugin, as CoreDNS's own build does (plugins.go says what the default
// build leaves out).
import _ "github.com/coredns/coredns/core/plugin"

var leftOut = map[string]string{}
