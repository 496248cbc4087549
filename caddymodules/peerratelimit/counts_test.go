package peerratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
)

// countsHandler is handler "counts-test": profile "all" with an overall
// burst of 1 per peer that nothing refills, and, with typed, message
// type "t" (path /t) without a limit worth the name.
func countsHandler(action string, typed bool) *HTTPHandler {
	p := ProfileConfig{Name: "all", Rate: 0.001, Burst: 1, Action: action}
	if typed {
		p.Messages = []MessageConfig{{Type: "t", Rate: 1000, MatchRaw: caddy.ModuleMap{"path": []byte(`["/t"]`)}}}
	}
	return &HTTPHandler{leasedConfig: leasedConfig{Name: "counts-test", Profiles: []ProfileConfig{p}}}
}

// verdictOf sends one request for path from peer through h and returns
// the verdict placeholder.
func verdictOf(t *testing.T, h *HTTPHandler, path, peer string) (verdict any) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	repl := caddy.NewReplacer()
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: peer})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(200); return nil })
	defer func() {
		if p := recover(); p != nil && !errors.Is(p.(error), http.ErrAbortHandler) {
			panic(p)
		}
		verdict, _ = repl.Get("http.peer_rate_limit.verdict")
	}()
	if err := h.ServeHTTP(httptest.NewRecorder(), r.WithContext(c), next); err != nil {
		t.Fatal(err)
	}
	return nil
}

// countSeries returns the decisions series of handler "counts-test" as
// "type/verdict" → value, read through a registry as a scrape would.
func countSeries(t *testing.T) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(decisionsCollector{})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["handler"] == "counts-test" {
				if l["profile"] != "all" {
					t.Fatalf("series of profile %q", l["profile"])
				}
				out[l["message_type"]+"/"+l["verdict"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// countsView returns the admin view's totals of profile "all" of
// handler "counts-test", and whether the view lists the handler.
func countsView() ([3]uint64, bool) {
	for _, v := range handlerViews() {
		if v.Name == "counts-test" {
			p := v.Profiles[0]
			return [3]uint64{p.AdmittedTotal, p.RejectedTotal, p.DroppedTotal}, true
		}
	}
	return [3]uint64{}, false
}

func wantCounts(t *testing.T, series map[string]float64, view [3]uint64) {
	t.Helper()
	got := countSeries(t)
	if len(got) != len(series) {
		t.Fatalf("series %v, want %v", got, series)
	}
	for k, v := range series {
		if n, ok := got[k]; !ok || n != v {
			t.Fatalf("series %s: %v, want %v (all: %v)", k, n, v, got)
		}
	}
	if v, ok := countsView(); !ok || v != view {
		t.Fatalf("view admitted, rejected, dropped %v (listed %v), want %v", v, ok, view)
	}
}

// The decision counts, as the metric and the admin view read them, carry
// over reloads — a message type the new config lacks keeps its series —
// and go with the handler.
func TestDecisionCountsLifetime(t *testing.T) {
	g1 := countsHandler("", true)
	provision(t, newGeneration(t), g1)
	for _, c := range []struct{ path, peer, want string }{
		{"/", "192.0.2.1", "admitted"}, {"/", "192.0.2.1", "rejected"}, {"/t", "192.0.2.2", "admitted"},
	} {
		if v := verdictOf(t, g1, c.path, c.peer); v != c.want {
			t.Fatalf("%s from %s: %v, want %s", c.path, c.peer, v, c.want)
		}
	}
	wantCounts(t, map[string]float64{"other/admitted": 1, "other/rejected": 1, "other/dropped": 0,
		"t/admitted": 1, "t/rejected": 0, "t/dropped": 0}, [3]uint64{2, 1, 0})

	g2 := countsHandler("drop", true)
	provision(t, newGeneration(t), g2)
	g1.Cleanup()
	if v := verdictOf(t, g2, "/t", "192.0.2.2"); v != "dropped" {
		t.Fatalf("after the reload: %v, want dropped", v)
	}
	all := map[string]float64{"other/admitted": 1, "other/rejected": 1, "other/dropped": 0,
		"t/admitted": 1, "t/rejected": 0, "t/dropped": 1}
	wantCounts(t, all, [3]uint64{2, 1, 1})

	g3 := countsHandler("", false)
	provision(t, newGeneration(t), g3)
	g2.Cleanup()
	wantCounts(t, all, [3]uint64{2, 1, 1})

	g3.Cleanup()
	if got := countSeries(t); len(got) != 0 {
		t.Fatalf("the handler is gone, its series stay: %v", got)
	}
	if _, ok := countsView(); ok {
		t.Fatal("the handler is gone, the view lists it")
	}
}
