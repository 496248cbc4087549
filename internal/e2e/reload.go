package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Reload replaces the running config the way an operator does with the CLI:
// `caddy reload --config FILE [--adapter caddyfile] --address ADMIN`. The
// config should leave the admin address unset, as for StartCaddy.
func (c *Caddy) Reload(t testing.TB, adapter, config string) {
	t.Helper()
	name := "reload.json"
	if adapter == "caddyfile" {
		name = "Caddyfile"
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"reload", "--config", path, "--address", c.Admin}
	if adapter != "json" {
		args = append(args, "--adapter", adapter)
	}
	if out, err := CaddyCommand(t, args...).CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
}

// Load replaces the running config through the admin API, POST /load, with
// config in adapter's format ("json" or "caddyfile"), as a config manager
// does.
func (c *Caddy) Load(t testing.TB, adapter, config string) {
	t.Helper()
	ctype := "application/json"
	if adapter == "caddyfile" {
		ctype = "text/caddyfile"
	}
	resp, err := http.Post("http://"+c.Admin+"/load", ctype, strings.NewReader(config))
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /load: %s %s", resp.Status, body)
	}
}

// AdminJSON GETs path from the admin API (e.g. "/latency_bucket/") and
// decodes the JSON answer into v.
func (c *Caddy) AdminJSON(t testing.TB, path string, v any) {
	t.Helper()
	if err := c.adminJSON(path, v); err != nil {
		t.Fatal(err)
	}
}

func (c *Caddy) adminJSON(path string, v any) error {
	resp, err := http.Get("http://" + c.Admin + path)
	if err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", path, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %v in %s", path, err, body)
	}
	return nil
}

// Metric returns the value of the first sample of the Prometheus metric
// whose line starts with series (a name, or a name with some of its labels,
// e.g. `caddy_edgesteer_x_total{policy="a"`), scraped from the admin API's
// /metrics; ok is false when no line matches.
func (c *Caddy) Metric(t testing.TB, series string) (value float64, ok bool) {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return metricValue(string(body), series)
}

// metricValue finds series in a Prometheus text exposition (see Metric).
func metricValue(text, series string) (value float64, ok bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, series) || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if _, err := fmt.Sscan(f[len(f)-1], &value); err == nil {
			return value, true
		}
	}
	return 0, false
}
