// Command coredns is CoreDNS with its stock plugins (all but the cloud-provider,
// Kubernetes and tracing ones, which plugins.go names; -tags coredns_all adds
// them) and every edgesteer plugin under corednsplugins/, placed in the plugin
// chain by directives.go.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	"github.com/edgesteer/edgesteer/internal/version"

	// edgesteer plugins: each also needs its place in directives.go.
	_ "github.com/edgesteer/edgesteer/corednsplugins/ogs"
)

func main() {
	directives, err := withEdgesteer(dnsserver.Directives, edgesteerPlugins)
	if err != nil {
		log.Fatalf("edgesteer: %v", err)
	}
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("edgesteer: %v", err)
	}
	// `coredns -version` ends its release line with the edgesteer version.
	coremain.GitCommit = "edgesteer " + version.Version
	coremain.Run()
}
