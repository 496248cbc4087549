package peerratelimit_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// orcaBackend is an upstream that reports the load the test gives it in
// the endpoint-load-metrics header of every answer ("" sends none).
func orcaBackend(t *testing.T) (string, *atomic.Value) {
	var header atomic.Value
	header.Store("")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := header.Load().(string); h != "" {
			w.Header().Set("Endpoint-Load-Metrics", h)
		}
		w.Write([]byte("ok\n"))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), &header
}

// orcaView is the orca part of the handler's dynamic view.
func orcaView(t *testing.T, c *e2e.Caddy) (*peerratelimit.DynamicView, *peerratelimit.ORCAView) {
	d := handlerView(adminView(t, c), "orders-ingress").Dynamic
	if d == nil || d.ORCA == nil {
		t.Fatalf("no dynamic orca view: %+v", d)
	}
	return d, d.ORCA
}

// The example rate-limit-orca.Caddyfile through bin/caddy, its backends
// reporting their CPU in their answers: the busiest backend's report
// drives the seed's table (90 % → 50 % withheld: POST /orders 200/s → 100/s),
// low reports bring the throttle back 20 points per reversal hold, and
// missing, garbage and oversized headers change nothing and are counted.
func TestHTTPDynamicFollowsORCA(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(e2e.Root(t), "Caddyfile.examples", "rate-limit-orca.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	a, loadA := orcaBackend(t)
	b, loadB := orcaBackend(t)
	loadA.Store("TEXT cpu_utilization=0.2, mem_utilization=0.5")
	loadB.Store(`JSON {"cpu_utilization": 0.3, "named_metrics": {"queue": 4}}`)
	front := e2e.Addr(t)
	cfg := strings.NewReplacer("127.0.0.1:8082", front, "127.0.0.1:9011", a, "127.0.0.1:9012", b,
		"orca_blackout 10s", "orca_blackout 1s", "reversal_hold 30s", "reversal_hold 2s",
		"interval 1s", "interval 200ms").Replace(string(data))
	c := e2e.StartCaddy(t, "caddyfile", cfg)
	c.WaitTCP(t, front)

	// Answers keep coming, so that both backends keep reporting; the
	// client never sees the header (the example deletes it).
	stop := make(chan struct{})
	done := make(chan struct{})
	var leaked atomic.Int64
	go func() {
		defer close(done)
		client := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			req, _ := http.NewRequest("GET", "http://"+front+"/status", nil)
			req.Header.Set("X-Peer", "monitor")
			if resp, err := client.Do(req); err == nil {
				if resp.Header.Get("Endpoint-Load-Metrics") != "" {
					leaked.Add(1)
				}
				resp.Body.Close()
			}
		}
	}()
	defer func() { close(stop); <-done }()

	wait := func(want float64, what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			v := adminView(t, c)
			if l := limitOf(v, "clients", "orders"); l.Effective == want {
				return
			} else if time.Now().After(deadline) {
				d := handlerView(v, "orders-ingress").Dynamic
				t.Fatalf("%s: effective orders limit %v, want %v (dynamic %+v, orca %+v)", what, l.Effective, want, d, d.ORCA)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Both backends fresh (past the 1 s blackout) at 20 and 30 %: the
	// load is the busiest's, under every threshold.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, o := orcaView(t, c)
		if len(o.Upstreams) == 2 && o.Upstreams[0].State == "fresh" && o.Upstreams[1].State == "fresh" && d.LoadPercent == 30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backends not fresh at load 30: %+v %+v", d, o)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wait(200, "cpu 20 and 30 %")

	loadA.Store("TEXT cpu_utilization=0.9")
	wait(100, "cpu 90 %") // 65 % and above: 50 % withheld
	if l := limitOf(adminView(t, c), "clients", "overall"); l.Effective != 1000 {
		t.Fatalf("the overall limit (not dynamic) moved to %v", l.Effective)
	}
	o := burst(t, "http://"+front+"/orders", "shop9", 2*time.Second)
	if got := o.ok.Load(); got > most(100, burstOf(100), o.elapsed) || o.rejected.Load() == 0 {
		t.Fatalf("orders admitted %d in %v at 50 %% throttle (%d rejected), want at most %d", got, o.elapsed, o.rejected.Load(), most(100, burstOf(100), o.elapsed))
	}

	// The busiest backend's headers turn to garbage, oversized, out of
	// range, then none: each is counted, and its last good report stands
	// through more than two reversal holds (taken as a lower load, any of
	// them would step the throttle back).
	from := time.Now()
	for _, step := range []struct{ header, outcome string }{
		{"TEXT cpu_utilization=0.1x", "bad_number"},
		{"TEXT cpu_utilization=0.1, named_metrics.pad=" + strings.Repeat("0", 3000) + "1", "too_long"},
		{`JSON {"cpu_utilization": -0.1}`, "out_of_range"},
		{"", "missing"},
	} {
		before := counts(t, c)
		loadA.Store(step.header)
		waitCounts(t, c, before, step.outcome)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		d, _ := orcaView(t, c)
		if d.ThrottlePercent != 50 || d.LoadPercent != 90 {
			t.Fatalf("garbage moved the throttle: %+v", d)
		}
		if d.SampledAt.Sub(from) > 5*time.Second { // sampled past two holds and more
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample 5 s after the garbage began: %+v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wait(100, "after garbage")

	// Low again: back 20 points per 2 s hold, 50 → 30 → 10 → 0.
	loadA.Store("TEXT cpu_utilization=0.2")
	loadB.Store("TEXT cpu_utilization=0.2")
	wait(140, "one hold below 50 %")
	wait(180, "two holds below 50 %")
	wait(200, "three holds below 50 %")

	// A reload keeps the reports and their runs, and applies new periods.
	_, o1 := orcaView(t, c)
	c.Reload(t, "caddyfile", strings.Replace(cfg, "orca_expiration 3m", "orca_expiration 4m", 1))
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, o2 := orcaView(t, c)
		if o2.ExpirationMs == 240000 {
			if len(o2.Upstreams) != 2 || o2.Upstreams[0].State != "fresh" || o2.Upstreams[0].ReportingForSeconds < o1.Upstreams[0].ReportingForSeconds ||
				o2.Answers["ok"] < o1.Answers["ok"] {
				t.Fatalf("reload lost the reports: before %+v, after %+v", o1, o2)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reload's orca_expiration not applied: %+v", o2)
		}
		time.Sleep(50 * time.Millisecond)
	}

	for _, want := range []string{
		`caddy_edgesteer_peer_rate_limit_orca_answers_total{handler="orders-ingress",outcome="ok"}`,
		`caddy_edgesteer_peer_rate_limit_orca_answers_total{handler="orders-ingress",outcome="bad_number"}`,
		`caddy_edgesteer_peer_rate_limit_orca_answers_total{handler="orders-ingress",outcome="missing"}`,
	} {
		if v, ok := c.Metric(t, want); !ok || v == 0 {
			t.Errorf("metric %s: %v %v", want, v, ok)
		}
	}
	if n := leaked.Load(); n > 0 {
		t.Errorf("%d answers showed the client the backends' load header", n)
	}
}

func counts(t *testing.T, c *e2e.Caddy) map[string]uint64 {
	_, o := orcaView(t, c)
	return o.Answers
}

// waitCounts waits until each outcome counted more answers than before.
func waitCounts(t *testing.T, c *e2e.Caddy, before map[string]uint64, outcomes ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, all := counts(t, c), true
		for _, o := range outcomes {
			all = all && now[o] > before[o]
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes %v not counted: %v → %v", outcomes, before, now)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The egress transport reads its upstream's answers: a group marked
// dynamic follows the cpu_utilization they report, keyed by the dial
// address, and the header is read from the upstream's response whatever
// the client's handler chain does.
func TestEgressDynamicFollowsORCA(t *testing.T) {
	up, load := orcaBackend(t)
	load.Store("TEXT cpu_utilization=0.3")
	front := e2e.Addr(t)
	c := e2e.StartCaddy(t, "caddyfile", fmt.Sprintf(`http://%s {
	bind 127.0.0.1
	reverse_proxy %s {
		transport peer_rate_limit {
			name orca-egress
			group g %s {
				rate 200
				dynamic
			}
			dynamic {
				source orca
				orca_blackout 0s
				interval 200ms
				threshold 65 50
			}
		}
	}
}`, front, up, up))
	c.WaitTCP(t, front)
	effective := func() (float64, *peerratelimit.ORCAView) {
		v := adminView(t, c)
		h := handlerView(v, "orca-egress")
		if h.Dynamic == nil || h.Dynamic.ORCA == nil {
			t.Fatalf("no orca view: %+v", h)
		}
		return limitOf(v, "g", "overall").Effective, h.Dynamic.ORCA
	}
	waitFor := func(want float64, header string) {
		t.Helper()
		load.Store(header)
		deadline := time.Now().Add(15 * time.Second)
		for {
			if resp, err := http.Get("http://" + front + "/"); err == nil {
				resp.Body.Close()
			}
			eff, o := effective()
			if eff == want && len(o.Upstreams) == 1 && o.Upstreams[0].Upstream == up {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: effective %v, want %v (%+v)", header, eff, want, o)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(200, "TEXT cpu_utilization=0.3")
	waitFor(100, `JSON {"cpu_utilization": 0.8}`)
}
