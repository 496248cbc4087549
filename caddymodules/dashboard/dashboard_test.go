package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
)

func TestSeriesRingIsBoundedAndRates(t *testing.T) {
	s := newSeries(3, 2)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		smp := newSample(t0.Add(time.Duration(i) * time.Second))
		smp.gauge("a", float64(i))
		smp.gauge("b", 10)
		smp.gauge("c", 1) // beyond max series: dropped
		smp.counter("n_total", float64(10*i))
		s.add(smp)
	}
	v := s.view(time.Time{})
	if len(v.TimesMS) != 3 || v.TimesMS[0] != 1002000 || v.TimesMS[2] != 1004000 {
		t.Fatalf("times %v: want the last 3 samples, oldest first", v.TimesMS)
	}
	if got := v.Values["a"]; len(got) != 3 || *got[0] != 2 || *got[2] != 4 {
		t.Fatalf("a = %v", got)
	}
	// a and b fill both slots; c and the counter's rate were dropped.
	if _, ok := v.Values["c"]; ok || v.Dropped == 0 {
		t.Fatalf("max series not enforced: %v, dropped %d", v.Values, v.Dropped)
	}
	s2 := newSeries(4, 10)
	for i, n := range []float64{5, 15, 35, 2} { // the last went down: a restart
		smp := newSample(t0.Add(time.Duration(2*i) * time.Second))
		smp.counter("n_total", n)
		s2.add(smp)
	}
	got := s2.view(time.Time{}).Values["n_total"]
	if len(got) != 4 || got[0] != nil || *got[1] != 5 || *got[2] != 10 || got[3] != nil {
		t.Fatalf("rates %v: want nil, 5/s, 10/s, nil", fmtPtrs(got))
	}
	// A series with nothing left in the window is forgotten.
	s3 := newSeries(2, 10)
	smp := newSample(t0)
	smp.gauge("gone", 1)
	s3.add(smp)
	s3.add(newSample(t0.Add(time.Second)))
	s3.add(newSample(t0.Add(2 * time.Second)))
	if len(s3.values) != 0 {
		t.Fatalf("stale series kept: %v", s3.values)
	}
	if v := s3.view(t0.Add(2 * time.Second)); len(v.TimesMS) != 1 {
		t.Fatalf("since: %v", v.TimesMS)
	}
}

func fmtPtrs(v []*float64) string {
	var b strings.Builder
	for _, p := range v {
		if p == nil {
			b.WriteString("nil ")
		} else {
			fmt.Fprintf(&b, "%g ", *p)
		}
	}
	return b.String()
}

// The walker charts the known gauges, every _total counter and map
// gauges, keyed by the names of the objects it passes, and tolerates
// fields it does not know.
func TestWalkKeys(t *testing.T) {
	var tree any
	json.Unmarshal([]byte(`[{"name":"p","publishers":[
		{"address":"a:1","latency_ms":3,"measured":true,"picks_total":7,"new_field":{"x":1}},
		{"address":"b:2","latency_ms":0,"measured":false}]},
		{"name":"h","open_connections":{"n1":2},"tenants":{"evil":{"connections":1,"x_total":1}},
		 "dynamic":{"load_percent":55}}]`), &tree)
	smp := newSample(time.Now())
	walk(smp, []string{"m"}, tree, false)
	k := func(p ...string) string { return strings.Join(p, sep) }
	want := map[string]float64{
		k("m", "p", "a:1", "latency_ms"):       3,
		k("m", "h", "open_connections", "n1"):  2,
		k("m", "h", "dynamic", "load_percent"): 55,
	}
	for key, v := range want {
		if smp.gauges[key] != v {
			t.Errorf("gauge %q = %v, want %v (all: %v)", key, smp.gauges[key], v, smp.gauges)
		}
	}
	if len(smp.gauges) != len(want) {
		t.Errorf("gauges %v", smp.gauges)
	}
	if len(smp.counters) != 1 || smp.counters[k("m", "p", "a:1", "picks_total")] != 7 {
		t.Errorf("counters %v", smp.counters)
	}
}

func TestCaddyfileAndValidation(t *testing.T) {
	var h Handler
	d := caddyfile.NewTestDispenser(`edgesteer_dashboard {
		ogs http://127.0.0.1:9153/ogs
		ogs http://127.0.0.1:9154/ogs
		replicas http://localhost:2021
		sample_interval 1s
		history 10m
		max_series 50
	}`)
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if len(h.OGS) != 2 || len(h.Replicas) != 1 || h.SampleInterval != caddy.Duration(time.Second) ||
		h.History != caddy.Duration(10*time.Minute) || h.MaxSeries != 50 {
		t.Fatalf("%+v", h)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	for cf, want := range map[string]string{
		`edgesteer_dashboard { sample_interval 10ms }`: "sample_interval",
		`edgesteer_dashboard { history 1s 2s }`:        "history",
		`edgesteer_dashboard { bogus 1 }`:              "bogus",
		`edgesteer_dashboard { max_series 0 }`:         "max_series",
		`edgesteer_dashboard { history 1m
			history 2m }`: "history",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(cf))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", cf, err, want)
		}
	}
	for _, bad := range []struct {
		h    Handler
		want string
	}{
		{Handler{OGS: []string{"ftp://x/"}}, `ogs "ftp://x/"`},
		{Handler{OGS: []string{"http:///x"}}, `ogs "http:///x"`},
		{Handler{Replicas: []string{"http://u:p@h:1"}}, "credentials"},
		{Handler{Replicas: []string{"http://h:1", "http://h:1"}}, "twice"},
		{Handler{SampleInterval: caddy.Duration(time.Second), History: caddy.Duration(500 * time.Millisecond)}, "history"},
		{Handler{SampleInterval: caddy.Duration(100 * time.Millisecond), History: caddy.Duration(time.Hour)}, "at most 10000 samples"},
	} {
		if err := bad.h.Validate(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.h, err, bad.want)
		}
	}
}

// The handler answers the page, its assets and the state, validates the
// query, and keeps the ogs and replica answers (or their errors).
func TestServeStateAssetsAndRemotes(t *testing.T) {
	views.Register("dashboard_test", func() any {
		return []map[string]any{{"name": "x", "latency_ms": 4.5, "measured": true, "hits_total": 3}}
	})
	ogs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"servers":[{"zone":"z.","locations":[{"location":"l","rtts_ms":{"g":3}}]}]}`)
	}))
	defer ogs.Close()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/edgesteer/views" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, `{"cache_redirect":[{"node":"l2a","requests_total":{"cache":9}}]}`)
	}))
	defer replica.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `[1,2]`) }))
	defer broken.Close()

	h := &Handler{OGS: []string{ogs.URL + "/ogs", broken.URL}, Replicas: []string{replica.URL + "/"},
		SampleInterval: caddy.Duration(100 * time.Millisecond)}
	if err := h.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()

	get := func(target string) (*httptest.ResponseRecorder, error) {
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, httptest.NewRequest("GET", target, nil), nil)
		return w, err
	}
	var st State
	deadline := time.Now().Add(20 * time.Second)
	for {
		w, err := get("/dash/api/state")
		if err != nil {
			t.Fatal(err)
		}
		st = State{}
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Series.TimesMS) >= 3 && st.OGS[0].Reachable && st.Replicas[0].Reachable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state never had samples and answers: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := st.Modules["dashboard_test"]; !ok {
		t.Errorf("modules %v", st.Modules)
	}
	for _, key := range []string{
		"dashboard_test" + sep + "x" + sep + "latency_ms",
		"dashboard_test" + sep + "x" + sep + "hits_total",
		"ogs" + sep + "0" + sep + "z." + sep + "l" + sep + "rtts_ms" + sep + "g",
		"replica" + sep + "0" + sep + "cache_redirect" + sep + "l2a" + sep + "requests_total" + sep + "cache",
	} {
		if _, ok := st.Series.Values[key]; !ok {
			t.Errorf("no series %q in %v", key, keys(st.Series.Values))
		}
	}
	if st.OGS[1].Reachable || !strings.Contains(st.OGS[1].Error, "not a JSON object") {
		t.Errorf("a non-object answer: %+v", st.OGS[1])
	}

	for target, code := range map[string]int{
		"/dash/api/state?window=0s": 200, "/dash/api/state?window=1m": 200,
		"/dash/api/state?window=-1s": 400, "/dash/api/state?window=16m": 400, "/dash/api/state?window=x": 400,
		"/dash/api/state?since=1": 400, "/dash/api/state?window=1s&window=2s": 400, "/dash/api/state?%zz": 400,
		"/dash/": 200, "/dash/assets/app.js": 200, "/dash/assets/uPlot.iife.min.js": 200, "/dash/assets/uPlot.LICENSE": 200,
		"/dash/assets/nope.js": 404, "/dash/assets/../handler.go": 404, "/dash/assets/": 404, "/dash/x": 404,
	} {
		w, err := get(target)
		got := w.Code
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			got = he.StatusCode
		}
		if got != code {
			t.Errorf("%s: %d (%v), want %d", target, got, err, code)
		}
	}
	w, _ := get("/dash/")
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") ||
		!strings.Contains(w.Body.String(), "assets/app.js") {
		t.Errorf("page: CSP %q, body %.200s", csp, w.Body.String())
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, strings.ReplaceAll(k, sep, "|"))
	}
	return out
}

// A reload with the same settings adopts the running sampler and its
// history; other settings start a new one; the last user stops it.
func TestReloadAdoptsSampler(t *testing.T) {
	cfg := func(iv time.Duration) *Handler {
		return &Handler{SampleInterval: caddy.Duration(iv), History: caddy.Duration(time.Minute)}
	}
	old := cfg(100 * time.Millisecond)
	if err := old.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(old.sampler.series.view(time.Time{}).TimesMS) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("no samples")
		}
		time.Sleep(20 * time.Millisecond)
	}
	same, other := cfg(100*time.Millisecond), cfg(200*time.Millisecond)
	if err := same.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	if err := other.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	old.Cleanup() // Caddy cleans the old generation up after the new one is provisioned
	if same.sampler != old.sampler || other.sampler == old.sampler {
		t.Fatal("the same settings must adopt the sampler, other settings must not")
	}
	if n := len(same.sampler.series.view(time.Time{}).TimesMS); n < 3 {
		t.Fatalf("history after the reload: %d samples", n)
	}
	s := same.sampler
	same.Cleanup()
	other.Cleanup()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sampler still runs after its last user was cleaned up")
	}
}
