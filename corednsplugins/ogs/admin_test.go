package ogs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The admin view lists at most 1000 locations, the newest results first,
// with the total; its JSON keeps the field names the README documents.
func TestAdminViewBoundedNewestFirst(t *testing.T) {
	o := newPluginWith(t, "probes 1\nrecheck off", rttProber{"192.0.2.1:1": 3 * time.Millisecond, "192.0.2.2:1": time.Millisecond})
	const n = adminLocations + 5
	for i := range n {
		o.sel.Select(context.Background(), fmt.Sprintf("ecs:10.%d.%d.0/24", i/256, i%256))
	}
	l := &adminListener{blocks: map[string][]*OGS{o.state: {o}}}
	rec := httptest.NewRecorder()
	l.serve(rec, httptest.NewRequest(http.MethodGet, "/ogs", nil))
	var v struct {
		Servers []map[string]json.RawMessage `json:"servers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || len(v.Servers) != 1 {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	for _, field := range []string{"zone", "store", "gateways", "locations", "locations_total", "last_run", "runs_total"} {
		if _, ok := v.Servers[0][field]; !ok {
			t.Errorf("no %q in %s", field, rec.Body.String()[:200])
		}
	}
	if _, ok := v.Servers[0]["redis_healthy"]; ok {
		t.Error("redis_healthy without store redis")
	}
	var locs []struct {
		Location string             `json:"location"`
		Order    []string           `json:"order"`
		RTTsMs   map[string]float64 `json:"rtts_ms"`
		ProbedAt time.Time          `json:"probed_at"`
	}
	json.Unmarshal(v.Servers[0]["locations"], &locs)
	var total, runs int
	json.Unmarshal(v.Servers[0]["locations_total"], &total)
	json.Unmarshal(v.Servers[0]["runs_total"], &runs)
	if len(locs) != adminLocations || total != n || runs != n {
		t.Fatalf("%d locations listed, total %d, runs %d; want %d, %d, %d", len(locs), total, runs, adminLocations, n, n)
	}
	for i := 1; i < len(locs); i++ {
		if locs[i].ProbedAt.After(locs[i-1].ProbedAt) {
			t.Fatalf("location %d newer than %d", i, i-1)
		}
	}
	if last := fmt.Sprintf("ecs:10.%d.%d.0/24", (n-1)/256, (n-1)%256); locs[0].Location != last && !locs[0].ProbedAt.Equal(locs[1].ProbedAt) {
		t.Fatalf("newest %s, want %s", locs[0].Location, last)
	}
	if l := locs[0]; l.Order[0] != "gw2" || l.RTTsMs["gw2"] != 1 || l.RTTsMs["gw1"] != 3 {
		t.Fatalf("location %+v", l)
	}
	rec = httptest.NewRecorder()
	l.serve(rec, httptest.NewRequest(http.MethodDelete, "/ogs", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE: %d", rec.Code)
	}
}
