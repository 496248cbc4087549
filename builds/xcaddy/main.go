// Command xcaddy builds Caddy with xcaddy from the manifest xcaddy.json.
// xcaddy reads no config file of its own, so this translates the manifest
// into one `xcaddy build` command line and runs it (or prints it with -n).
//
//	go run ./builds/xcaddy -manifest xcaddy.json -output bin/caddy-xcaddy
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Manifest is the content of xcaddy.json.
type Manifest struct {
	// Caddy is the Caddy version to build, e.g. "v2.11.9".
	Caddy string `json:"caddy"`
	// Xcaddy is the xcaddy version the Makefile installs.
	Xcaddy string `json:"xcaddy"`
	// Replace maps a module path to a local directory, relative to the
	// manifest's directory.
	Replace map[string]string `json:"replace,omitempty"`
	// Plugins are the packages to build in, each with a version unless its
	// module is replaced locally.
	Plugins []Plugin `json:"plugins"`
}

// Plugin is one package passed to xcaddy with --with.
type Plugin struct {
	Package string `json:"package"`
	Version string `json:"version,omitempty"`
}

// LoadManifest reads and checks a manifest.
func LoadManifest(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Manifest
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m.Caddy == "" {
		return nil, fmt.Errorf("%s: \"caddy\" (the Caddy version) is required", path)
	}
	for _, p := range m.Plugins {
		if p.Package == "" {
			return nil, fmt.Errorf("%s: a plugin has no \"package\"", path)
		}
		if p.Version == "" && m.replacedModule(p.Package) == "" {
			return nil, fmt.Errorf("%s: plugin %q needs a \"version\" (or a local \"replace\" of its module)", path, p.Package)
		}
	}
	return &m, nil
}

// replacedModule returns the replaced module that contains pkg, or "".
func (m *Manifest) replacedModule(pkg string) string {
	for mod := range m.Replace {
		if pkg == mod || strings.HasPrefix(pkg, mod+"/") {
			return mod
		}
	}
	return ""
}

// Args returns the xcaddy arguments, with replacement directories made
// absolute against baseDir. xcaddy needs --replace for a local module plus
// --with on its sub-packages: "--with module=./dir" alone makes it ask the
// module proxy for the local module.
func (m *Manifest) Args(baseDir, output string) []string {
	args := []string{"build", m.Caddy}
	if output != "" {
		args = append(args, "--output", output)
	}
	mods := make([]string, 0, len(m.Replace))
	for mod := range m.Replace {
		mods = append(mods, mod)
	}
	sort.Strings(mods)
	for _, mod := range mods {
		dir := m.Replace[mod]
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(baseDir, dir)
		}
		args = append(args, "--replace", mod+"="+dir)
	}
	for _, p := range m.Plugins {
		with := p.Package
		if p.Version != "" {
			with += "@" + p.Version
		}
		args = append(args, "--with", with)
	}
	return args
}

// Env returns environ with the locally replaced modules kept away from the
// network: xcaddy's final `go get` resolves their sub-packages by import
// path, and a module proxy may answer the lookup of an unpublished path with
// an error rather than "not found", which stops go get before it falls back
// to the replacement. With the module outside the proxy (GONOPROXY,
// GONOSUMDB) and version control refused for it (GOVCS off), the lookup is
// refused locally and the replacement is used.
func (m *Manifest) Env(environ []string) []string {
	if len(m.Replace) == 0 {
		return environ
	}
	mods := make([]string, 0, len(m.Replace))
	for mod := range m.Replace {
		mods = append(mods, mod)
	}
	sort.Strings(mods)
	vcs := make([]string, len(mods))
	for i, mod := range mods {
		vcs[i] = mod + ":off"
	}
	add := map[string]string{
		"GONOPROXY": strings.Join(mods, ","),
		"GONOSUMDB": strings.Join(mods, ","),
		"GOVCS":     strings.Join(vcs, ","),
	}
	out := make([]string, 0, len(environ)+len(add))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if extra, ok := add[k]; ok {
			if v != "" {
				extra += "," + v // ours first: GOVCS takes the first match
			}
			out = append(out, k+"="+extra)
			delete(add, k)
			continue
		}
		out = append(out, kv)
	}
	for _, k := range []string{"GONOPROXY", "GONOSUMDB", "GOVCS"} {
		if v, ok := add[k]; ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

func main() {
	manifestPath := flag.String("manifest", "xcaddy.json", "build manifest")
	output := flag.String("output", "bin/caddy-xcaddy", "binary to write")
	xcaddyBin := flag.String("xcaddy", "", "xcaddy executable (default: go install the manifest's xcaddy version into -tools)")
	toolsDir := flag.String("tools", "bin/tools", "where the manifest's xcaddy version is installed")
	dryRun := flag.Bool("n", false, "print the xcaddy command line and exit")
	flag.Parse()

	m, err := LoadManifest(*manifestPath)
	if err != nil {
		fatal(err)
	}
	baseDir, err := filepath.Abs(filepath.Dir(*manifestPath))
	if err != nil {
		fatal(err)
	}
	out, err := filepath.Abs(*output)
	if err != nil {
		fatal(err)
	}
	args := m.Args(baseDir, out)
	if *dryRun {
		fmt.Println("xcaddy", strings.Join(args, " "))
		return
	}
	if *xcaddyBin == "" {
		if *xcaddyBin, err = installXcaddy(m.Xcaddy, *toolsDir); err != nil {
			fatal(err)
		}
	}
	fmt.Fprintln(os.Stderr, *xcaddyBin, strings.Join(args, " "))
	cmd := exec.Command(*xcaddyBin, args...)
	cmd.Env = m.Env(os.Environ())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fatal(err)
	}
}

// installXcaddy installs xcaddy at version into dir/xcaddy-<version> unless
// it is there already, and returns its path.
func installXcaddy(version, dir string) (string, error) {
	if version == "" {
		return "", fmt.Errorf("the manifest names no \"xcaddy\" version")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "xcaddy-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp, err := os.MkdirTemp("", "xcaddy-install")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", "github.com/caddyserver/xcaddy/cmd/xcaddy@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("installing xcaddy %s: %w", version, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return bin, os.Rename(filepath.Join(tmp, "xcaddy"), bin)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "xcaddy manifest:", err)
	os.Exit(1)
}
