package e2e_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func run(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

func TestCaddyVersionNamesEdgesteer(t *testing.T) {
	out := run(t, e2e.CaddyCommand(t, "version"))
	if !strings.HasPrefix(out, "edgesteer test-") || !strings.Contains(out, "caddy v2.11.9") {
		t.Fatalf("caddy version: %q", out)
	}
}

func TestCaddyListsLayer4Modules(t *testing.T) {
	mods := moduleIDs(run(t, e2e.CaddyCommand(t, "list-modules")))
	for _, want := range []string{
		"layer4", "layer4.handlers.proxy", "layer4.matchers.tls",
		"layer4.proxy.selection_policies.round_robin",
		"http.handlers.reverse_proxy", "http.reverse_proxy.selection_policies.least_conn",
	} {
		if !slices.Contains(mods, want) {
			t.Errorf("list-modules lacks %s", want)
		}
	}
}

func TestCoreDNSVersionAndPlugins(t *testing.T) {
	bin := e2e.Bin(t, "coredns")
	out := run(t, exec.Command(bin, "-version"))
	if !strings.Contains(out, "CoreDNS-1.15.0") || !strings.Contains(out, "edgesteer test-") {
		t.Fatalf("coredns -version: %q", out)
	}
	out = run(t, exec.Command(bin, "-plugins"))
	for _, want := range []string{"template", "forward", "cache", "hosts", "prometheus"} {
		if !slices.Contains(strings.Fields(out), want) {
			t.Errorf("coredns -plugins lacks %s", want)
		}
	}
}

// The xcaddy build from xcaddy.json must hold exactly the modules of the go
// build from builds/caddy, so the two cannot drift apart.
func TestXcaddyBuildListsSameModules(t *testing.T) {
	bin := e2e.XcaddyBin(t) // built by `go run ./builds/xcaddy` from xcaddy.json

	list := func(bin string) []string {
		c := exec.Command(bin, "list-modules")
		c.Env = append(os.Environ(), "HOME="+t.TempDir())
		return moduleIDs(run(t, c))
	}
	goBuilt, xBuilt := list(e2e.Bin(t, "caddy")), list(bin)
	if len(goBuilt) < 100 {
		t.Fatalf("go build lists only %d modules", len(goBuilt))
	}
	if !slices.Equal(goBuilt, xBuilt) {
		t.Fatalf("module lists differ:\nonly go build: %v\nonly xcaddy:   %v",
			minus(goBuilt, xBuilt), minus(xBuilt, goBuilt))
	}
}

// moduleIDs picks the module IDs out of `caddy list-modules` output.
func moduleIDs(out string) []string {
	var ids []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.Contains(line, " ") {
			continue // blank lines and "Standard modules: N" summaries
		}
		ids = append(ids, line)
	}
	slices.Sort(ids)
	return ids
}

func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}
