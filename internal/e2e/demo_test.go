package e2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// `make run`'s script starts the demo, which answers over HTTP, layer 4 and
// DNS, and Ctrl-C (SIGINT to its process group) stops everything.
func TestDemoStartsAndStopsOnInterrupt(t *testing.T) {
	root := e2e.Root(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "demo.sh"))
	cmd.Dir = root
	dnsPort := e2e.FreePort(t)
	cmd.Env = append(cmd.Environ(),
		"BIN_DIR="+filepath.Dir(e2e.Bin(t, "caddy")),
		fmt.Sprintf("DEMO_DNS_PORT=%d", dnsPort))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ready := make(chan struct{})
	var output strings.Builder // written only by the reader below until done
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			output.WriteString(sc.Text() + "\n")
			if sc.Text() == "demo ready" {
				close(ready)
			}
		}
		done <- cmd.Wait()
	}()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("demo ended (%v) before it was ready:\n%s\n%s", err, output.String(), stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("demo not ready in 60 s:\n%s", stderr.String())
	}

	seen := map[string]bool{}
	for range 4 {
		resp, err := http.Get("http://127.0.0.1:8480/hello")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "answered GET /hello") {
			t.Fatalf("front answered %q", body)
		}
		seen[resp.Header.Get("X-Upstream")] = true
	}
	if !seen["127.0.0.1:8481"] || !seen["127.0.0.1:8482"] {
		t.Fatalf("round robin reached %v, want both publishers", seen)
	}

	conn, err := net.DialTimeout("tcp", "127.0.0.1:8490", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(conn, "GET /l4 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.Contains(string(body), "answered GET /l4") {
		t.Fatalf("layer4 proxy answered %q", body)
	}

	out, err := exec.Command("dig", "@127.0.0.1", "-p", fmt.Sprint(dnsPort), "www.demo.edgesteer.test", "A", "+short", "+tries=1", "+time=2").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "127.0.0.1" {
		t.Fatalf("dig: %v %q", err, out)
	}

	// Ctrl-C in a terminal signals the whole foreground process group.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo exited with %v:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop within 30 s of SIGINT")
	}
	for _, addr := range []string{"127.0.0.1:8480", "127.0.0.1:8490", fmt.Sprintf("127.0.0.1:%d", dnsPort)} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the demo stopped", addr)
		}
	}
}
