package e2e_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Every Caddyfile example must pass `caddy validate`, run from the
// repository root as the examples say (file paths in them are relative).
func TestCaddyfileExamplesValidate(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(e2e.Root(t), "Caddyfile.examples", "*.Caddyfile"))
	if len(files) == 0 {
		t.Fatal("no Caddyfile examples found")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cmd := e2e.CaddyCommand(t, "validate", "--adapter", "caddyfile", "--config", f)
			cmd.Dir = e2e.Root(t)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("caddy validate: %v\n%s", err, out)
			}
		})
	}
}

// The check above must be able to fail.
func TestCaddyValidateRejectsBadConfig(t *testing.T) {
	f := filepath.Join(t.TempDir(), "bad.Caddyfile")
	os.WriteFile(f, []byte("http://127.0.0.1:1 {\n\tno_such_directive\n}\n"), 0o644)
	out, err := e2e.CaddyCommand(t, "validate", "--adapter", "caddyfile", "--config", f).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no_such_directive") {
		t.Fatalf("want a failure naming the directive; err=%v\n%s", err, out)
	}
}

var queryLine = regexp.MustCompile(`(?m)^#\s*query:\s*(\S+)\s+(\S+)\s*$`)

// Every Corefile example must start and answer a query: the one named on a
// "# query: NAME TYPE" line (which must get NOERROR and an answer, by dig),
// else an SOA query for its first zone (any response code).
func TestCorefileExamplesAnswer(t *testing.T) {
	if _, err := exec.LookPath("dig"); err != nil {
		t.Fatal("dig is needed (Debian package dnsutils; make test installs it)")
	}
	files, _ := filepath.Glob(filepath.Join(e2e.Root(t), "Corefile.examples", "*.Corefile"))
	if len(files) == 0 {
		t.Fatal("no Corefile examples found")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			probe := firstZone(t, string(data)) + " SOA"
			m := queryLine.FindStringSubmatch(string(data))
			if m != nil {
				probe = m[1] + " " + m[2]
			}
			d := e2e.StartCoreDNS(t, string(data), probe)
			if m == nil {
				return
			}
			host, port := splitHostPort(d.Addr)
			out, err := exec.Command("dig", "@"+host, "-p", port, m[1], m[2], "+tries=1", "+time=2").CombinedOutput()
			if err != nil {
				t.Fatalf("dig: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "status: NOERROR") || !regexp.MustCompile(`ANSWER: [1-9]`).Match(out) {
				t.Fatalf("want NOERROR with an answer for %s %s:\n%s", m[1], m[2], out)
			}
		})
	}
}

// firstZone returns the first server block key of a Corefile.
func firstZone(t *testing.T, corefile string) string {
	sc := bufio.NewScanner(strings.NewReader(corefile))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key := strings.TrimSuffix(strings.Fields(line)[0], "{")
		key = strings.TrimPrefix(key, "dns://")
		if i := strings.LastIndex(key, ":"); i >= 0 {
			key = key[:i]
		}
		if key == "" || key == "." {
			return "example.test."
		}
		return key
	}
	t.Fatal("no server block")
	return ""
}

func splitHostPort(addr string) (string, string) {
	i := strings.LastIndex(addr, ":")
	return addr[:i], addr[i+1:]
}
