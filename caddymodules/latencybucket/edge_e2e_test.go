package latencybucket_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// edge is bin/caddy, its publishers and its clients in a network namespace
// of their own, with net.ipv4.tcp_migrate_req on. Caddy binds a new
// listening socket per config (SO_REUSEPORT) and closes the old one after a
// reload; without tcp_migrate_req the kernel resets the connections still
// queued on the old socket, so a steady stream loses a few connections per
// reload whatever the handlers do. The README's Reloads section says so.
type edge struct {
	tp     *e2e.Topology
	client *http.Client
}

const edgeAdmin = "127.0.0.1:2019"

func newEdge(t *testing.T) *edge {
	tp := e2e.NewTopology(t, map[string]int{"edge": 10})
	tp.Run(t, "edge", "sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1")
	return &edge{tp: tp, client: tp.HTTPClient("edge")}
}

// publishers starts testpeers on 127.0.0.1:9001… in the namespace.
func (e *edge) publishers(t *testing.T, delays ...time.Duration) []string {
	addrs := make([]string, len(delays))
	for i, d := range delays {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", 9001+i)
		name := fmt.Sprintf("publisher-%d", i+1)
		p := e.tp.Start(t, "edge", name, e2e.Bin(t, "testpeer"), nil, "-listen", addrs[i], "-name", name, "-probe-delay", d.String())
		dial := e.tp.Dialer("edge", nil)
		p.WaitFor(t, "tcp "+addrs[i], 30*time.Second, func() error {
			c, err := dial(context.Background(), "tcp", addrs[i])
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	return addrs
}

func (e *edge) views(t *testing.T) []latencybucket.PolicyView {
	t.Helper()
	resp, err := e.client.Get("http://" + edgeAdmin + "/latency_bucket/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v []latencybucket.PolicyView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (e *edge) waitView(t *testing.T, policy, what string, ok func(latencybucket.PolicyView) bool) latencybucket.PolicyView {
	t.Helper()
	var last []latencybucket.PolicyView
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		last = e.views(t)
		for _, v := range last {
			if v.Name == policy && ok(v) {
				return v
			}
		}
		time.Sleep(50 * ms)
	}
	t.Fatalf("policy %s never %s: %+v", policy, what, last)
	return latencybucket.PolicyView{}
}

// reload runs `caddy reload` in the namespace.
func (e *edge) reload(t *testing.T, cfg string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	base := e2e.CaddyCommand(t, "reload", "--config", path, "--adapter", "caddyfile", "--address", edgeAdmin)
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.tp.NS("edge"), base.Path}, base.Args[1:]...)...)
	cmd.Env = base.Env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
}

// load POSTs the Caddyfile to /load.
func (e *edge) load(t *testing.T, cfg string) {
	t.Helper()
	resp, err := e.client.Post("http://"+edgeAdmin+"/load", "text/caddyfile", strings.NewReader(cfg))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /load: %s %s", resp.Status, body)
	}
}
