package peerratelimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

// TestORCAFeedOutcomes: every answer gets one outcome, and only a good
// report with cpu_utilization reaches the tracker.
func TestORCAFeedOutcomes(t *testing.T) {
	tr, err := orca.NewTracker(orca.Periods{Expiration: time.Minute}, 4)
	if err != nil {
		t.Fatal(err)
	}
	f := &orcaFeed{tracker: tr}
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	for _, c := range []struct {
		h        http.Header
		upstream string
		want     string
	}{
		{h("Endpoint-Load-Metrics", "TEXT cpu_utilization=0.4"), "", "no_upstream"},
		{h(), "a:1", "missing"},
		{h("Endpoint-Load-Metrics", "TEXT cpu_utilization=0.4", "Endpoint-Load-Metrics", "TEXT cpu_utilization=0.1"), "a:1", "duplicate"},
		{h("Endpoint-Load-Metrics", "TEXT application_utilization=0.4"), "a:1", "no_utilization"},
		{h("Endpoint-Load-Metrics", "cpu_utilization=0.4"), "a:1", "unknown_format"},
		{h("Endpoint-Load-Metrics-Bin", "!!"), "a:1", "bad_base64"},
		{h("Endpoint-Load-Metrics", "JSON {\"cpu_utilization\":0.7}"), "b:1", "ok"},
	} {
		if got := orcaOutcome(f.read(c.h, c.upstream, 1)); got != c.want {
			t.Errorf("%v from %q: %s, want %s", c.h, c.upstream, got, c.want)
		}
	}
	if tr.Len() != 1 || tr.Get("b:1") == nil {
		t.Fatalf("tracker holds %d upstreams, want only b:1", tr.Len())
	}
}
