package peerratelimit_test

import (
	"math"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// Three bin/caddy replicas whose wall clocks disagree, one 1.5 s ahead of
// the machine's and one 1.5 s behind (skewclock: the unmodified binary,
// its wall-clock reads answered with the offset), each more than the sync
// interval (250 ms) and the replica TTL (1 s). The limit follows the
// store's clock, so they still share one peer's limit of R/s: R ± 5 %
// over 10 s at the upstream, with the client offering 3R/s rotating over
// them; every replica sees the other two; each view shows its own
// offset from the store's clock. (Before epochs followed Redis' TIME,
// 0.8 s of skew admitted 1.67 R.)
func TestClusterClockSkew(t *testing.T) {
	e2e.SkipShort(t)
	const R = 100.0
	offsets := map[string]time.Duration{"r1": 1500 * time.Millisecond, "r2": 0, "r3": -1500 * time.Millisecond}
	ct := newClusterTopologyVia(t, replicaCaddyfile(R, false), func(host string) []string {
		return []string{e2e.Bin(t, "skewclock"), "-offset", offsets[host].String(), "--"}
	})
	tp := ct.tp
	ct.waitAll(t, "three replicas registered, each with its clock offset measured", ct.replicas, func(v *peerratelimit.ClusterView) bool {
		return v.RedisHealthy && v.ReplicasSeen == 3 && v.ClockOffsetMs != nil
	})
	for _, r := range ct.replicas {
		v := ct.view(r)
		want := float64(offsets[r].Milliseconds())
		t.Logf("%s: clock offset %+.1f ms (skewed %+v), rtt %.1f ms", r, *v.ClockOffsetMs, offsets[r], *v.ClockRTTMs)
		if math.Abs(*v.ClockOffsetMs-want) > 100 {
			t.Errorf("%s: the view says its clock is %+.1f ms off the store's, want %+.0f ± 100", r, *v.ClockOffsetMs, want)
		}
	}

	lc := startLoad(t, ct, 3*R, []string{tp.IP("r1"), tp.IP("r2"), tp.IP("r3")})
	time.Sleep(3 * time.Second) // shares settle from the floor to proportional
	lc.setTag("skewed")
	time.Sleep(10 * time.Second)
	lc.setTag("after")
	time.Sleep(500 * time.Millisecond) // answers in flight arrive
	got, w := ct.upstreamCounts(t)["skewed"], lc.window("skewed")
	if float64(w.sent) < 2*R*10 {
		t.Fatalf("the client offered only %d requests in 10 s (want ≥ 2R/s): the machine is too loaded to test the limit", w.sent)
	}
	if len(w.failed) > 0 {
		t.Errorf("%d of %d requests failed (not 200 or 429), e.g. %v", len(w.failed), w.sent, w.failed[:min(3, len(w.failed))])
	}
	t.Logf("clocks +1.5 s / 0 / -1.5 s: offered %d, upstream counted %d (limit %v/s × 10 s): %.3f × the limit", w.sent, got, R, float64(got)/(10*R))
	if !within(float64(got), 10*R, 0.05) {
		t.Errorf("upstream counted %d in 10 s, want %v ± 5 %%", got, 10*R)
	}
	for _, r := range ct.replicas {
		if v := ct.view(r); v == nil || v.ReplicasSeen != 3 {
			t.Errorf("%s: view %+v, want 3 replicas seen", r, v)
		}
	}
}
