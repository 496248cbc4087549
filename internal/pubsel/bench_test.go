package pubsel

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/sticky"
)

// BenchmarkSelect measures each path of a pick on one selector, pool sizes
// 4 and 64, every publisher measured in [0,32) unless said otherwise:
// new_pick (no pair), sticky_hit (a local hit), sticky_new (a local miss
// that pins: now moves past the TTL each pick), store_local_hit (a local
// hit with a shared store), store_hit (a local miss the store answers),
// store_new (a miss at both levels: the pick is claimed in the store),
// fallback (nothing measured), slow_start (half the publishers warming).
func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{4, 64} {
		pool := pubs(n)
		measured := func(b *testing.B, tr *Tracker) {
			for _, u := range pool {
				measure(b, tr, u.addr, 5*ms)
			}
		}
		// run benchmarks s picking for user ("": SelectUnpinned), now
		// moving by step each pick, each called before it; every pick
		// must be decided as want says (Sticky, FromStore).
		run := func(name string, s *Selector[*up], user string, step int64, want Decision, each ...func()) {
			b.Run(fmt.Sprintf("%s/upstreams=%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				now := int64(0)
				if s.StickyStore != nil {
					now = time.Now().UnixNano()
				}
				pin := s.Sticky != nil && user != ""
				s.Select(pool, user, "app", now) // builds the view, pins the pair
				for b.Loop() {
					now += step
					for _, f := range each {
						f()
					}
					var d Decision
					var ok bool
					if pin {
						_, d, ok = s.Select(pool, user, "app", now)
					} else {
						_, d, ok = s.SelectUnpinned(pool, now)
					}
					if !ok || d.Sticky != want.Sticky || d.FromStore != want.FromStore {
						b.Fatalf("pick %v: sticky %v, from store %v", ok, d.Sticky, d.FromStore)
					}
				}
			})
		}
		for w, name := range []string{WithinRandom: "random", WithinLeastConn: "least_conn", WithinP2C: "p2c"} {
			tr := newTracker(b, Config{})
			measured(b, tr)
			run("new_pick_"+name, &Selector[*up]{Tracker: tr, Host: upHost{}, Within: Within(w)}, "", 0, Decision{})
		}
		for _, k := range []int{3, ChoicesAll} {
			tr := newTracker(b, Config{})
			measured(b, tr)
			run(fmt.Sprintf("new_pick_p2c_choices_%d", min(k, n)), &Selector[*up]{Tracker: tr, Host: upHost{}, Within: WithinP2C, Choices: k}, "", 0, Decision{})
		}
		tr := newTracker(b, Config{})
		measured(b, tr)
		table := sticky.New(1<<16, time.Hour)
		run("sticky_hit", &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}, "user", 0, Decision{Sticky: true})
		run("sticky_new", &Selector[*up]{Tracker: tr, Host: upHost{}, Sticky: table}, "user", int64(2*time.Hour), Decision{})
		store := NewMemStore()
		r := newReplica(b, store, pool)
		measured(b, r.st.Tracker())
		run("store_local_hit", r.sel, "user", 0, Decision{Sticky: true})
		run("store_hit", r.sel, "user", int64(2*time.Hour), Decision{Sticky: true, FromStore: true})
		run("store_new", r.sel, "user", int64(2*time.Hour), Decision{}, store.Flush)
		run("fallback", &Selector[*up]{Tracker: newTracker(b, Config{}), Host: upHost{}}, "", 0, Decision{})
		// Half the pool measured first, the other half entering the lowest
		// bucket after: that half warms.
		tr = newTracker(b, Config{})
		warm := &Selector[*up]{Tracker: tr, Host: upHost{}, SlowStart: time.Hour}
		for i, u := range pool {
			if i == n/2 {
				warm.SelectUnpinned(pool, 0)
			}
			measure(b, tr, u.addr, 5*ms)
		}
		run("slow_start", warm, "", 1, Decision{})
	}
}

// BenchmarkBuild measures the view a pool change or a bucket change builds.
func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{4, 64} {
		for _, store := range []bool{false, true} {
			pool := pubs(n)
			tr := newTracker(b, Config{})
			s := &Selector[*up]{Tracker: tr, Host: upHost{}}
			if store {
				r := newReplica(b, NewMemStore(), pool)
				tr, s = r.st.Tracker(), r.sel
			}
			for i, u := range pool {
				measure(b, tr, u.addr, time.Duration(1+i%3*40)*ms) // three buckets
			}
			b.Run(fmt.Sprintf("store=%v/upstreams=%d", store, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					s.build(pool)
				}
			})
		}
	}
}
