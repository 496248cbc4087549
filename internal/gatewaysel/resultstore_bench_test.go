package gatewaysel

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSelectCached is a query whose location is fresh in memory, with
// no store and with a store configured: the local level answers either way,
// so the store must cost nothing there (it reports the store calls per
// query, which must be 0).
func BenchmarkSelectCached(b *testing.B) {
	for _, withStore := range []bool{false, true} {
		name := map[bool]string{false: "no_store", true: "store"}[withStore]
		b.Run(name, func(b *testing.B) {
			cfg := Config{Gateways: exampleGateways(), Prober: exampleProber(), ProbeID: "tcp", Recheck: -1}
			var store *fakeStore
			if withStore {
				store = newFakeStore()
				cfg.Store = store
			}
			s, err := NewTable(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			if sel := s.Select(ctx, "loc"); sel.Source != Probed {
				b.Fatalf("warm-up: %v", sel.Source)
			}
			var calls int64
			if store != nil {
				// The run shares its result (SET, then the lock's
				// release) after answering: let it finish first.
				for store.value("loc") == "" || store.locked("loc") {
					time.Sleep(time.Millisecond)
				}
				calls = store.calls.Load()
			}
			b.ReportAllocs()
			for b.Loop() {
				if s.Select(ctx, "loc").Source != Cached {
					b.Fatal("not a local hit")
				}
			}
			if store != nil {
				b.ReportMetric(float64(store.calls.Load()-calls)/float64(b.N), "store_calls/op")
			}
		})
	}
}
