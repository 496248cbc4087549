package dashboard

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"
)

// TestWalkLatencyBucketLoad: a latency_bucket publisher's in_flight and
// cost_ms are charted (what within p2c compares), in this Caddy's view and
// a replica's; the same names in another module's view are not.
func TestWalkLatencyBucketLoad(t *testing.T) {
	var tree any
	json.Unmarshal([]byte(`[{"name":"p","publishers":[{"address":"a:1","in_flight":3,"cost_ms":1.5,"load_factor":2,"orca_age_ms":9}]}]`), &tree)
	for _, prefix := range [][]string{{"latency_bucket"}, {"replica", "0", "latency_bucket"}} {
		smp := newSample(time.Now())
		walk(smp, prefix, tree, false)
		walk(smp, []string{"tenant_route"}, tree, false)
		k := func(parts ...string) string {
			return strings.Join(append(append([]string(nil), prefix...), parts...), sep)
		}
		want := map[string]float64{k("p", "a:1", "in_flight"): 3, k("p", "a:1", "cost_ms"): 1.5}
		if !maps.Equal(smp.gauges, want) || len(smp.counters) != 0 {
			t.Errorf("%v: gauges %v, want %v; counters %v", prefix, smp.gauges, want, smp.counters)
		}
	}
}
