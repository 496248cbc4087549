// Package e2e runs the real edgesteer binaries for end-to-end tests: it
// builds bin/caddy and bin/coredns once per source state, starts them with a
// given config on free loopback ports, waits until they answer, shows their
// logs when a test fails, and always stops them.
package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Root returns the repository root (the directory holding go.mod).
func Root(t testing.TB) string {
	t.Helper()
	root, err := findRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// SkipShort skips an end-to-end test under `go test -short`, which runs
// only the unit and in-process tests (no root, no binaries, no peers). CI's
// `make test` runs without -short, so there nothing is skipped.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end to end (real binaries and peers): not run with -short")
	}
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Bin returns the path of a freshly built binary: "caddy", "coredns",
// "testpeer" (internal/e2e/testpeer), "skewclock" (internal/e2e/skew), "ogs-report" (builds/ogs-report) or "diameterload" (bench/diameterload: the demo's Diameter peers and load). All are built together into bin/test/<hash of the sources>/, so every test
// package of one `go test ./...` run, and later runs with unchanged sources,
// share one build; a file lock keeps concurrent test processes from building
// twice.
func Bin(t testing.TB, name string) string {
	t.Helper()
	SkipShort(t)
	buildOnce.Do(func() { binDir, buildErr = Build() })
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	return filepath.Join(binDir, name)
}

// Build builds the binaries Bin returns, unless the build for the current
// sources is there already, and returns their directory. scripts/test.sh
// calls it (through internal/e2e/buildbins) before `go test`, so the tests
// find the binaries built and no test process builds them while go test
// compiles the same packages in parallel.
func Build() (string, error) {
	root, err := findRoot()
	if err != nil {
		return "", err
	}
	sum, err := sourceHash(root)
	if err != nil {
		return "", err
	}
	base := filepath.Join(root, "bin", "test")
	unlock, err := lockDir(base)
	if err != nil {
		return "", err
	}
	defer unlock()

	dir := filepath.Join(base, sum[:16])
	stamp := filepath.Join(dir, ".complete")
	if _, err := os.Stat(stamp); err == nil {
		return dir, nil
	}
	// Older builds are of no further use once no test can still be
	// running them: a build of the last hour stays (a source edited during
	// a test run starts a new build beside the one that run uses).
	if old, _ := filepath.Glob(filepath.Join(base, "*")); len(old) > 0 {
		for _, o := range old {
			if fi, err := os.Stat(o); err == nil && filepath.Base(o) != ".lock" && time.Since(fi.ModTime()) > time.Hour {
				os.RemoveAll(o)
			}
		}
	}
	// -s -w: no symbol table or DWARF (stack traces and profiles keep their
	// names); the link of these large binaries is a good part of a test run.
	ldflags := "-s -w -X github.com/edgesteer/edgesteer/internal/version.Version=test-" + sum[:12]
	cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", dir+string(filepath.Separator),
		"./builds/caddy", "./builds/coredns", "./internal/e2e/testpeer", "./internal/e2e/skew/cmd/skewclock",
		"./builds/ogs-report", "./bench/diameterload")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return dir, os.WriteFile(stamp, []byte(sum+"\n"), 0o644)
}

// lockDir creates dir and takes its file lock, which keeps concurrent test
// processes from building the same binaries twice.
func lockDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		lock.Close()
	}, nil
}

var (
	xcaddyOnce sync.Once
	xcaddyBin  string
	xcaddyErr  error
)

// XcaddyBin returns the path of bin/test/<hash>/caddy-xcaddy, Caddy built by
// xcaddy from xcaddy.json (`make xcaddy`), building it first unless the build
// for the current sources is there.
func XcaddyBin(t testing.TB) string {
	t.Helper()
	SkipShort(t)
	xcaddyOnce.Do(func() { xcaddyBin, xcaddyErr = BuildXcaddy() })
	if xcaddyErr != nil {
		t.Fatalf("building caddy with xcaddy: %v", xcaddyErr)
	}
	return xcaddyBin
}

// BuildXcaddy builds caddy-xcaddy beside the binaries of Build (and those
// first, if need be), unless it is there already, and returns its path.
// scripts/test.sh builds it (through internal/e2e/buildbins) in its build
// stage, so the test that compares its modules with bin/caddy's only runs
// it, and a run with unchanged sources builds nothing.
func BuildXcaddy() (string, error) {
	dir, err := Build()
	if err != nil {
		return "", err
	}
	root, err := findRoot()
	if err != nil {
		return "", err
	}
	unlock, err := lockDir(filepath.Dir(dir))
	if err != nil {
		return "", err
	}
	defer unlock()
	bin := filepath.Join(dir, "caddy-xcaddy")
	stamp := filepath.Join(dir, ".complete-xcaddy")
	if _, err := os.Stat(stamp); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "run", "./builds/xcaddy", "-manifest", "xcaddy.json",
		"-output", bin, "-tools", filepath.Join(root, "bin", "tools"))
	cmd.Dir = root
	// xcaddy's default go build flags (-trimpath, -tags nobadger,nomysql,nopgx)
	// change every package's build ID, so the build compiled all of Caddy a
	// second time. Neither can change which modules register: with only
	// -ldflags the build reuses the packages Build compiled and just links.
	// xcaddy also sets CGO_ENABLED=0 unless CGO_ENABLED=1 is in its
	// environment, and cgo changes the build of net and so of nearly every
	// package: without it, the build compiled Caddy's dependency graph a
	// second time (145 s of a cold run's 443 s build stage). Go's own
	// setting for this machine keeps xcaddy's build to a link.
	cgo, err := exec.Command("go", "env", "CGO_ENABLED").Output()
	if err != nil {
		return "", fmt.Errorf("go env CGO_ENABLED: %v", err)
	}
	cmd.Env = append(os.Environ(), "XCADDY_GO_BUILD_FLAGS=-ldflags='-s -w'",
		"CGO_ENABLED="+strings.TrimSpace(string(cgo)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %v\n%s", cmd, err, out)
	}
	return bin, os.WriteFile(stamp, nil, 0o644)
}

// sourceHash digests everything that goes into the binaries: go.mod, go.sum,
// xcaddy.json, every non-test Go file outside bin/, testdata and hidden
// directories, and the files embedded with go:embed (those under an assets/ directory).
func sourceHash(root string) (string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "bin" || name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if name == "go.mod" || name == "go.sum" || name == "xcaddy.json" ||
			(strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")) ||
			filepath.Base(filepath.Dir(path)) == "assets" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s\x00", rel)
		fh, err := os.Open(f)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return "", err
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
