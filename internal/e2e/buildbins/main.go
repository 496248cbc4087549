// Command buildbins builds the end-to-end binaries (bin/test/<hash of the
// sources>/caddy, coredns, testpeer, …, and caddy-xcaddy) exactly as the
// tests' e2e.Bin and e2e.XcaddyBin would, and prints their directory. scripts/test.sh runs it before `go test`.
package main

import (
	"fmt"
	"os"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func main() {
	dir, err := e2e.Build()
	if err == nil {
		_, err = e2e.BuildXcaddy()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "buildbins:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
