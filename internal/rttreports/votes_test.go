package rttreports

import (
	"slices"
	"testing"
	"time"
)

// Votes pulled from a shared store are validated like network input and
// merged by the local rule: a newer vote replaces an older one (never the
// reverse), a vote for an unconfigured gateway or past the window is left
// out, a malformed one is counted and ignored; the merged votes order the
// location as the same reports added here would.
func TestMergeStoredVotes(t *testing.T) {
	now := t0.Add(time.Hour)
	at := now.Add(-time.Minute)
	local := newReports(Config{Probe: "https"})
	shared := newReports(Config{Probe: "https"})
	stored := map[string]string{}
	for _, who := range []string{"a|192.0.2.1", "a|192.0.2.2", "b|192.0.2.3"} {
		p := rep(at, "gw1", 300*ms, "gw2", 130*ms, "gw3", 500*ms, "gw4", "fail")
		mustAdd(t, local, "192.0.2.0/24", who, p, now)
		for _, m := range p.Measurements {
			stored[VoteField(who, m.Gateway)] = EncodeVote(m.RTT, m.Failed, at)
		}
	}
	stored[VoteField("c|192.0.2.4", "gw9")] = EncodeVote(ms, false, at)                    // not configured here
	stored[VoteField("c|192.0.2.4", "gw1")] = EncodeVote(ms, false, now.Add(-5*time.Hour)) // past the window
	for f, v := range map[string]string{
		"no-space":                      "1 1",
		VoteField("d|192.0.2.5", "gw1"): "0 1700000000000",                         // RTT 0
		VoteField("d|192.0.2.5", "gw2"): "nan 1700000000000",                       // not a number
		VoteField("d|192.0.2.5", "gw3"): EncodeVote(ms, false, now.Add(time.Hour)), // future
		VoteField("d|192.0.2.5", "gw4"): "3600000 1700000000000",                   // an hour
		VoteField("e|192.0.2.6", "gw1"): "5",                                       // no time
	} {
		stored[f] = v
	}
	n, err := shared.Merge("192.0.2.0/24", stored, now)
	if n != 6 || err == nil {
		t.Fatalf("%d malformed (%v), want 6", n, err)
	}
	want, _ := orderNames(t, local, "192.0.2.0/24", now)
	got, reporters := orderNames(t, shared, "192.0.2.0/24", now)
	if !slices.Equal(got, want) || reporters != 3 {
		t.Fatalf("merged order %v from %d reporters, want %v from 3", got, reporters, want)
	}
	// An older stored vote does not replace a newer local one.
	mustAdd(t, shared, "192.0.2.0/24", "a|192.0.2.1", rep(now, "gw1", 10*ms), now)
	shared.Merge("192.0.2.0/24", map[string]string{VoteField("a|192.0.2.1", "gw1"): EncodeVote(900*ms, false, at)}, now)
	if v, _ := shared.StoredVotes("192.0.2.0/24", "a|192.0.2.1"); !slices.ContainsFunc(v, func(sv StoredVote) bool {
		return sv.Gateway == "gw1" && sv.Value == EncodeVote(10*ms, false, now)
	}) {
		t.Fatalf("a newer local vote was replaced: %v", v)
	}
}
