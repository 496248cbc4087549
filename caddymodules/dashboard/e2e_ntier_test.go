package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// TestNtierPanelInChromium: the transparent N-tier upper tier (bin/caddy
// with the ntier app in a namespace, next to two lower nodes' namespaces)
// serves the dashboard; Chromium on the host reads it through a forwarder.
// With l2a's health port answering and l2b's not, the panel shows the rules
// installed, l2a up with all 256 buckets and l2b down with none and its
// check error; once l2b answers, it is up again with its own 128 buckets.
func TestNtierPanelInChromium(t *testing.T) {
	tp := e2e.NewTopology(t, map[string]int{"upper": 1, "l2a": 2, "l2b": 3})
	dir := t.TempDir()
	tiers := fmt.Sprintf(`{"nodes":[{"name":"l2a","next_hop":%q},{"name":"l2b","next_hop":%q}]}`, tp.IP("l2a"), tp.IP("l2b"))
	if err := os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(tiers), 0o644); err != nil {
		t.Fatal(err)
	}
	healthPort := func(host string) {
		var ln net.Listener
		if err := tp.In(host, func() (err error) { ln, err = net.Listen("tcp", ":3129"); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
				c.Close()
			}
		}()
	}
	healthPort("l2a")
	tp.StartCaddy(t, "upper", `{
	ntier {
		upper {
			tier_map tiers.json
			ports 80
			health_port 3129
			health_interval 300ms
			health_timeout 200ms
			fall 2
		}
	}
}
http://127.0.0.1:8488 {
	bind 127.0.0.1
	edgesteer_dashboard {
		sample_interval 500ms
	}
}`, dir, nil)

	// The dashboard listens in the upper namespace: a host listener whose
	// connections are dialled there.
	fwd, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	dial := tp.Dialer("upper", nil)
	go func() {
		for c, err := fwd.Accept(); err == nil; c, err = fwd.Accept() {
			go func() {
				defer c.Close()
				d, err := dial(context.Background(), "tcp", "127.0.0.1:8488")
				if err != nil {
					return
				}
				defer d.Close()
				go io.Copy(d, c)
				io.Copy(c, d)
			}()
		}
	}()

	b := newBrowser(t, 1280, 800)
	b.navigate("http://" + fwd.Addr().String() + "/")
	// rows returns the upper card's node rows: node → its cells.
	rows := func() (installed string, nodes map[string][]string) {
		var cells [][]string
		b.eval(`Array.from(document.querySelectorAll('#panel-ntier .card')).filter(c => c.dataset.id.startsWith("nt")).flatMap(c =>
			Array.from(c.querySelectorAll('.tablewrap tbody tr')).map(r => Array.from(r.cells).map(d => d.innerText)))`, &cells)
		b.eval(`(function(){var c=document.querySelector('#panel-ntier .card');return c?c.innerText:""})()`, &installed)
		nodes = map[string][]string{}
		for _, r := range cells {
			if len(r) == 9 {
				nodes[r[0]] = r
			}
		}
		return installed, nodes
	}
	// wait until the rows show want (node → health, buckets, own), or fail.
	wait := func(what string, want map[string][3]string) map[string][]string {
		t.Helper()
		var text string
		var nodes map[string][]string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
			text, nodes = rows()
			ok := strings.Contains(text, "rules installed") && len(nodes) == len(want)
			for n, w := range want {
				r := nodes[n]
				ok = ok && len(r) == 9 && r[3] == w[0] && strings.TrimSpace(r[5]) == w[1] && r[6] == w[2]
			}
			if ok {
				return nodes
			}
		}
		_, _, console := b.recorded()
		t.Fatalf("%s: the N-tier panel shows %q, rows %q (console %q)", what, text, nodes, console)
		return nil
	}
	nodes := wait("l2b down", map[string][3]string{"l2a": {"up", "256", "128"}, "l2b": {"down", "0", "128"}})
	if r := nodes["l2b"]; r[1] != tp.IP("l2b") || !strings.Contains(r[8], "3129") {
		t.Errorf("l2b's row %q: want its next hop %s and its check's error", r, tp.IP("l2b"))
	}
	b.screenshot("ntier-l2b-down.png")
	healthPort("l2b")
	wait("l2b back", map[string][3]string{"l2a": {"up", "128", "128"}, "l2b": {"up", "128", "128"}})
	// The chart of buckets per node has points for both.
	var points int
	b.eval(`(function(){var b=document.querySelector('[data-chart$="\u001fbuckets"]');return b?Number(b.dataset.points):0})()`, &points)
	if points < 2 {
		t.Errorf("the buckets chart has %d points", points)
	}
	requests, dialogs, console := b.recorded()
	for _, r := range requests {
		if !strings.HasPrefix(r, "http://"+fwd.Addr().String()+"/") {
			t.Errorf("the page requested %s", r)
		}
	}
	if len(dialogs)+len(console) > 0 {
		t.Errorf("dialogs %q, console %q", dialogs, console)
	}
}
