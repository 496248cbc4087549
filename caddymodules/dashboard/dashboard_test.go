package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/views"
	"github.com/edgesteer/edgesteer/internal/e2e"
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

// TestWalkDiameterAgent: the agent's view charts its peers' latency and
// outstanding by host, its groups' pending and counts (counters without
// _total) and its bindings, the same in a replica's view; nothing of its
// downstream peers (named by their CER, client data) and none of these
// names in another module's view.
func TestWalkDiameterAgent(t *testing.T) {
	var agent, other any
	json.Unmarshal([]byte(`[{"name":"dra","peers":[{"host":"pcrf1.example","address":"127.0.0.1:1","state":"OKAY","outstanding":3,"latency_ns":250000,"dwr_sent":2}],
		"groups":[{"name":"pcrf","pending":3,"admitted":10,"refused":4,"busy":0,"unavailable":1,"failed_over":2,"timed_out":0}],
		"downstreams":[{"host":"pgw1","realm":"r","pending":1}],"bindings":7,"max_bindings":100}]`), &agent)
	json.Unmarshal([]byte(`[{"name":"p","publishers":[{"address":"a:1","pending":2,"admitted":5,"latency_ns":9}]}]`), &other)
	k := func(p ...string) string { return strings.Join(p, sep) }
	for _, prefix := range [][]string{{"diameter_agent"}, {"replica", "0", "diameter_agent"}} {
		smp := newSample(time.Now())
		walk(smp, prefix, agent, false)
		walk(smp, []string{"latency_bucket"}, other, false)
		p := func(parts ...string) string { return k(append(append([]string(nil), prefix...), parts...)...) }
		gauges := map[string]float64{
			p("dra", "pcrf1.example", "latency_ns"): 250000, p("dra", "pcrf1.example", "outstanding"): 3,
			p("dra", "pcrf", "pending"): 3, p("dra", "bindings"): 7,
		}
		counters := map[string]float64{
			p("dra", "pcrf", "admitted"): 10, p("dra", "pcrf", "refused"): 4, p("dra", "pcrf", "busy"): 0,
			p("dra", "pcrf", "unavailable"): 1, p("dra", "pcrf", "failed_over"): 2, p("dra", "pcrf", "timed_out"): 0,
		}
		if !maps.Equal(smp.gauges, gauges) {
			t.Errorf("%v: gauges %v, want %v", prefix, smp.gauges, gauges)
		}
		if !maps.Equal(smp.counters, counters) {
			t.Errorf("%v: counters %v, want %v", prefix, smp.counters, counters)
		}
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
		{Handler{Replicas: []string{"http://h:1", "http://h:1/"}}, "twice"},
		{Handler{Replicas: []string{"http://h:1/config/"}}, "admin API address"},
		{Handler{Replicas: []string{"http://h:1?x=1"}}, "admin API address"},
		{Handler{OGS: []string{"http://h:1/ogs#x"}}, "fragment"},
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
		w, err := get("/api/state")
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

	for target, want := range map[string]struct {
		code int
		body string
	}{
		"/api/state?window=0s": {200, ""}, "/api/state?window=1m": {200, ""},
		"/api/state?window=-1s":          {400, `parameter window "-1s": want window=<duration> from 0s to the history (15m0s)`},
		"/api/state?window=16m":          {400, `parameter window "16m"`},
		"/api/state?window=x":            {400, `parameter window "x"`},
		"/api/state?since=1":             {400, `unknown parameter "since"; the one parameter accepted is window=<duration>`},
		"/api/state?url=http://evil/":    {400, `unknown parameter "url"`},
		"/api/state?window=1s&window=2s": {400, "parameter window given 2 times"},
		"/api/state?%zz":                 {400, `the query does not parse`},
		"/":                              {200, ""}, "/assets/app.js": {200, ""}, "/assets/uPlot.iife.min.js": {200, ""}, "/assets/uPlot.LICENSE": {200, ""},
		"/assets/nope.js": {404, `no asset "nope.js"`}, "/assets/../handler.go": {404, ""}, "/assets/": {404, ""},
		"/x": {404, "the dashboard answers /, /assets/<name> and /api/state"},
		// Exactly these paths: not under another prefix (handle_path strips it).
		"/dash/": {404, ""}, "/dash/api/state": {404, ""}, "/x/assets/app.js": {404, ""}, "/index.html": {404, ""},
	} {
		w, err := get(target)
		if err != nil {
			t.Errorf("%s: %v", target, err)
			continue
		}
		if w.Code != want.code || !strings.Contains(w.Body.String(), want.body) {
			t.Errorf("%s: %d %q, want %d with %q", target, w.Code, w.Body.String(), want.code, want.body)
		}
	}
	w, _ := get("/")
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

// Every fetch goes to the configured URL only: a 3xx is the answer (shown
// as unreachable with the redirect named; the target gets no connection),
// an answer over maxFetchBytes is an error after at most that much is
// read, a hanging URL costs at most the fetch timeout, an answer that is
// not the view it should be is refused, and the last good answer stays
// (stale) when a later fetch fails.
func TestFetchRules(t *testing.T) {
	target, accepted := e2e.HangingListener(t, "127.0.0.1:0")
	var redirects []string
	for _, code := range []int{301, 302, 307, 308} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://"+target+"/config/", code)
		}))
		t.Cleanup(srv.Close)
		redirects = append(redirects, srv.URL)
	}
	var sent atomic.Int64
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"servers":[`)
		chunk := []byte(strings.Repeat(`{"zone":"z."},`, 1000))
		for range (50 << 20) / len(chunk) {
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(huge.Close)
	declared := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(50<<20))
		w.WriteHeader(200)
	}))
	t.Cleanup(declared.Close)
	config := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"apps":{"edgesteer_redis":{"stores":{"main":{"password":"s3cret"}}}}}`)
	}))
	t.Cleanup(config.Close)
	var fail atomic.Bool
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `{"servers":[{"zone":"z."}],"extra":"dropped"}`)
	}))
	t.Cleanup(flaky.Close)
	hanging, _ := e2e.HangingListener(t, "127.0.0.1:0")

	ogs := append(slices.Clone(redirects), huge.URL, declared.URL, config.URL, flaky.URL, "http://"+hanging+"/ogs")
	const timeout = 300 * time.Millisecond
	s := newSampler(timeout, time.Minute, 100, ogs, redirects)
	defer s.Destruct()
	start := time.Now()
	s.sampleOnce(context.Background())
	if el := time.Since(start); el > 3*timeout {
		t.Errorf("a sample with a hanging URL took %v, more than 3× the fetch timeout %v", el, timeout)
	}
	got := map[string]remote{}
	for _, r := range s.remoteList("ogs", ogs) {
		got[r.URL] = r
	}
	for i, u := range redirects {
		code := []int{301, 302, 307, 308}[i]
		for _, r := range []remote{got[u], s.remoteList("replica", redirects)[i]} {
			want := fmt.Sprintf("HTTP %d → http://%s/config/", code, target)
			if r.Reachable || !strings.HasPrefix(r.Error, want) || r.Body != nil {
				t.Errorf("%s: %+v, want unreachable %q", u, r, want)
			}
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the redirect target got %d connections", n)
	}
	if r := got[huge.URL]; r.Reachable || !strings.Contains(r.Error, "larger than the 4194304-byte limit") {
		t.Errorf("50 MB answer: %+v", r)
	}
	if n := sent.Load(); n > 16<<20 { // loopback socket buffers hold several MB beyond what was read
		t.Errorf("the 50 MB answer: %d bytes written before the dashboard stopped reading", n)
	}
	if r := got[declared.URL]; r.Reachable || !strings.Contains(r.Error, "answer of 52428800 bytes, more than the 4194304-byte limit") {
		t.Errorf("declared 50 MB: %+v", r)
	}
	if r := got[config.URL]; r.Reachable || !strings.Contains(r.Error, "not an ogs view") || strings.Contains(string(r.Body), "s3cret") {
		t.Errorf("a Caddy config as ogs answer: %+v", r)
	}
	if r := got["http://"+hanging+"/ogs"]; r.Reachable || !strings.Contains(r.Error, "Timeout") {
		t.Errorf("hanging: %+v", r)
	}
	first := got[flaky.URL]
	if !first.Reachable || string(first.Body) != `{"servers":[{"zone":"z."}]}` {
		t.Fatalf("flaky, first: %+v", first)
	}
	fail.Store(true)
	time.Sleep(10 * time.Millisecond)
	s.sampleOnce(context.Background())
	r := s.remoteList("ogs", []string{flaky.URL})[0]
	if r.Reachable || !strings.Contains(r.Error, "HTTP 503") || string(r.Body) != string(first.Body) ||
		!r.BodyFetchedAt.Equal(first.FetchedAt) || !r.FetchedAt.After(r.BodyFetchedAt) {
		t.Errorf("flaky, after a failure: %+v, want the last good body kept from %v", r, first.FetchedAt)
	}
}

// Error bodies repeat a piece of the request only when it is plain (see
// echo): markup, control bytes, a forged log line or a long text sent in a
// path, a parameter's name or value, or the method never comes back.
func TestErrorBodiesRepeatNoRequestText(t *testing.T) {
	h := &Handler{History: caddy.Duration(15 * time.Minute)}
	for _, c := range []struct {
		method, target string
		code           int
	}{
		{"GET", "/%3Csvg%20onload=alert(1)%3E", 404},
		{"GET", "/assets/%3Cscript%3Ealert(1)%3C%2Fscript%3E", 404},
		{"GET", "/x%0D%0Alevel=error%20msg=forged", 404},
		{"GET", "/" + strings.Repeat("a", 65), 404},
		{"GET", "/api/state?%3Csvg%20onload%3Dalert(1)%3E=1", 400},
		{"GET", "/api/state?window=%3Csvg%20onload%3Dalert(1)%3E", 400},
		{"GET", "/api/state?window=1s%0Alevel=error", 400},
		{"GET", "/api/state?%zz%3Csvg%20onload=alert(1)%3E", 400},
		{"<SVG/ONLOAD=ALERT(1)>", "/", 405},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", c.target, nil)
		r.Method = c.method
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Fatalf("%s %s: %v", c.method, c.target, err)
		}
		body := strings.TrimSuffix(w.Body.String(), "\n")
		if w.Code != c.code || strings.ContainsAny(body, "\r\n") || strings.Contains(strings.ToLower(body), "alert") ||
			strings.Contains(body, "forged") || strings.Contains(body, strings.Repeat("a", 65)) ||
			(!strings.Contains(body, "(not shown)") && !strings.Contains(body, "does not parse")) {
			t.Errorf("%s %s: %d %q, want %d and none of the request's text", c.method, c.target, w.Code, body, c.code)
		}
	}
	// Plain text still comes back, for whoever typed it.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/assets/nope-1.js", nil), nil)
	if !strings.Contains(w.Body.String(), `no asset "nope-1.js"`) {
		t.Errorf("a plain asset name: %q", w.Body.String())
	}
}
