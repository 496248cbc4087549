package peerratelimit

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestClusterViewShape: the cluster view's JSON keys, the admin API's
// contract with the dashboard and scripts (the overall limit's and each
// message type's quota fields come from one embedded view).
func TestClusterViewShape(t *testing.T) {
	limit := []string{"effective_limit_per_second", "fallback", "fallback_peers", "key_prefix", "limit_per_second",
		"malformed_total", "overflowed_total", "peers_tracked", "repaired_total", "shares", "store_trouble", "throttle_percent"}
	off := 1.5
	v := ClusterView{ClockOffsetMs: &off, ClockRTTMs: &off, LastError: "x", LastErrorReason: "timeout",
		Messages: []ClusterMessageView{{}}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := append([]string{"clock_offset_ms", "clock_rtt_ms", "errors_by_reason", "last_error", "last_error_reason",
		"messages", "redis", "redis_healthy", "replica", "replicas_reserved", "replicas_seen", "reserving",
		"sync_errors_total", "sync_interval_ms"}, limit...)
	if keys := sortedKeys(got); !slices.Equal(keys, sorted(want)) {
		t.Errorf("cluster view keys\n%v, want\n%v", keys, sorted(want))
	}
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(got["messages"], &msgs); err != nil || len(msgs) != 1 {
		t.Fatalf("messages %s: %v", got["messages"], err)
	}
	if keys := sortedKeys(msgs[0]); !slices.Equal(keys, sorted(append([]string{"type"}, limit...))) {
		t.Errorf("message view keys %v", keys)
	}
}

func sortedKeys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return sorted(out)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
