package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestArgsReplaceAndWith(t *testing.T) {
	m := &Manifest{
		Caddy:   "v2.11.9",
		Replace: map[string]string{"github.com/edgesteer/edgesteer": "."},
		Plugins: []Plugin{
			{Package: "github.com/mholt/caddy-l4", Version: "v0.1.2"},
			{Package: "github.com/edgesteer/edgesteer/caddymodules/x"},
		},
	}
	got := m.Args("/src", "/out/caddy")
	want := []string{"build", "v2.11.9", "--output", "/out/caddy",
		"--replace", "github.com/edgesteer/edgesteer=/src",
		"--with", "github.com/mholt/caddy-l4@v0.1.2",
		"--with", "github.com/edgesteer/edgesteer/caddymodules/x"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestLoadManifestErrors(t *testing.T) {
	for name, body := range map[string]string{
		"no caddy":          `{"plugins": []}`,
		"unknown field":     `{"caddy": "v2.11.9", "plugin": []}`,
		"plugin no version": `{"caddy": "v2.11.9", "plugins": [{"package": "example.com/p"}]}`,
		"plugin no package": `{"caddy": "v2.11.9", "plugins": [{"version": "v1.0.0"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "xcaddy.json")
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadManifest(p); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestRepositoryManifestLoads(t *testing.T) {
	m, err := LoadManifest("../../xcaddy.json")
	if err != nil {
		t.Fatal(err)
	}
	if m.Xcaddy == "" {
		t.Fatal("xcaddy.json names no xcaddy version")
	}
}

func TestEnvKeepsReplacedModulesLocal(t *testing.T) {
	m := &Manifest{Replace: map[string]string{"github.com/edgesteer/edgesteer": "."}}
	got := m.Env([]string{"PATH=/bin", "GOVCS=private:all"})
	want := []string{"PATH=/bin", "GOVCS=github.com/edgesteer/edgesteer:off,private:all",
		"GONOPROXY=github.com/edgesteer/edgesteer", "GONOSUMDB=github.com/edgesteer/edgesteer"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
