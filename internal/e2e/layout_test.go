package e2e_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

const modulePath = "github.com/edgesteer/edgesteer"

// packagesUnder lists the import paths of the Go packages (directories with
// non-test .go files) below dir.
func packagesUnder(t *testing.T, root, dir string) []string {
	var pkgs []string
	filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == "internal" {
			return filepath.SkipDir // helpers shared by modules, not modules
		}
		gos, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, g := range gos {
			if !strings.HasSuffix(g, "_test.go") {
				rel, _ := filepath.Rel(root, path)
				pkgs = append(pkgs, modulePath+"/"+filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	return pkgs
}

func imports(t *testing.T, file string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		out = append(out, p)
	}
	return out
}

// builds/caddy imports every module package under caddymodules/, and
// xcaddy.json lists exactly the plugins builds/caddy adds to Caddy's
// standard modules.
func TestCaddyPluginListsInStep(t *testing.T) {
	root := e2e.Root(t)
	main := imports(t, filepath.Join(root, "builds/caddy/main.go"))
	for _, p := range packagesUnder(t, root, "caddymodules") {
		if !slices.Contains(main, p) {
			t.Errorf("builds/caddy/main.go does not import %s", p)
		}
	}
	var plugins []string
	for _, p := range main {
		// Everything but Caddy itself and our own internals is a plugin.
		if !strings.HasPrefix(p, "github.com/caddyserver/caddy/v2") && !strings.HasPrefix(p, modulePath+"/internal/") {
			plugins = append(plugins, p)
		}
	}
	var manifest struct {
		Plugins []struct{ Package string } `json:"plugins"`
	}
	data, err := os.ReadFile(filepath.Join(root, "xcaddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &manifest); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, p := range manifest.Plugins {
		listed = append(listed, p.Package)
	}
	slices.Sort(plugins)
	slices.Sort(listed)
	if !slices.Equal(plugins, listed) {
		t.Fatalf("builds/caddy plugins %v, xcaddy.json plugins %v", plugins, listed)
	}
}

// builds/coredns imports every plugin package under corednsplugins/.
func TestCoreDNSPluginsImported(t *testing.T) {
	root := e2e.Root(t)
	main := imports(t, filepath.Join(root, "builds/coredns/main.go"))
	for _, p := range packagesUnder(t, root, "corednsplugins") {
		if !slices.Contains(main, p) {
			t.Errorf("builds/coredns/main.go does not import %s", p)
		}
	}
}

// The engines (internal/) depend on no framework: not Caddy, CoreDNS, zap
// or the Prometheus client, and on none of our adapters; go-redis only in
// the Redis client layer (redisconn) and the Redis store packages, so an
// engine takes its store through its own Store interface. Checked over
// every package each engine pulls in, not only its direct imports.
func TestEnginesImportNoFramework(t *testing.T) {
	root := e2e.Root(t)
	forbidden := []string{
		"github.com/caddyserver/", "github.com/coredns/", "go.uber.org/zap",
		"github.com/prometheus/client_golang", "github.com/redis/go-redis/",
		modulePath + "/caddymodules", modulePath + "/corednsplugins",
	}
	redisLayer := map[string]bool{ // may use go-redis: the client layer and the stores on it
		modulePath + "/internal/redisconn":  true,
		modulePath + "/internal/quotaredis": true,
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "./internal/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	engines := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		deps := strings.Fields(line)
		pkg := deps[0]
		if redisLayer[pkg] || strings.HasPrefix(pkg, modulePath+"/internal/e2e") {
			continue
		}
		engines++
		for _, dep := range deps[1:] {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) && !redisLayer[dep] {
					t.Errorf("engine %s depends on %s", pkg, dep)
				}
			}
		}
	}
	if engines < 10 {
		t.Fatalf("go list found %d engine packages under internal/", engines)
	}
}
