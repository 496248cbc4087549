package diameteragent

import (
	"strconv"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameter"
)

// BenchmarkSharedBindingHit is BenchmarkRouteAndAnswer's per-message cost
// on binding hits, without a binding store and with one (an in-memory
// store): a hit asks nothing of the store, so the two should cost the
// same, give or take the epoch check (BENCHMARKS.md takes the ratio).
func BenchmarkSharedBindingHit(b *testing.B) {
	for _, store := range []string{"none", "shared"} {
		b.Run("store="+store, func(b *testing.B) {
			cfg := baseConfig()
			if store == "shared" {
				cfg.BindingStore = &diambind.Config{Store: diambind.NewMemStore(), Name: "mem", Prefix: "p"}
			}
			a, d := benchAgent(b, cfg)
			const sessions = 10_000
			msgs := make([][]byte, sessions)
			for i := range msgs {
				msgs[i] = req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;" + strconv.Itoa(i), e2e: uint32(i)}.bytes(b)
			}
			answer := req{app: diameter.AppGx, ccType: 2, session: "x", e2e: 1}.bytes(b)
			answer[4] &^= 0x80 // an answer
			one := func(msg []byte) {
				if err := scan(msg, "dra.example", &d.info); err != nil {
					b.Fatal(err)
				}
				a.route(d, msg, &d.info)
				for _, u := range a.gen.Load().groups["pcrf"].members {
					if l := u.link.Load(); l.count.Load() > 0 {
						setHopByHop(answer, l.nextHbh)
						a.answered(l, answer, nil)
						drainOut(l, d.link)
						return
					}
				}
				b.Fatal("not forwarded")
			}
			for _, m := range msgs { // bind every session first
				one(m)
			}
			if s := a.shared.Load(); s != nil {
				for deadline := time.Now().Add(5 * time.Second); s.View().Queued > 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				one(msgs[i%sessions])
			}
		})
	}
}

// BenchmarkBoundServerHit is the binding lookup alone on a local hit,
// without a store and with one: the difference is the epoch check.
func BenchmarkBoundServerHit(b *testing.B) {
	for _, store := range []string{"none", "shared"} {
		b.Run("store="+store, func(b *testing.B) {
			cfg := baseConfig()
			if store == "shared" {
				cfg.BindingStore = &diambind.Config{Store: diambind.NewMemStore(), Name: "mem", Prefix: "p"}
			}
			a, _ := benchAgent(b, cfg)
			var in msgInfo
			if err := scan(req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;1", e2e: 1}.bytes(b), "dra.example", &in); err != nil {
				b.Fatal(err)
			}
			key, now := a.sessionKey(in.sessionID), time.Now()
			a.bound(key, &in, 0, a.gen.Load().peers["pcrf1.example"], false, now)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, ok := a.boundServer(key, &in, now); !ok {
					b.Fatal("no binding")
				}
			}
		})
	}
}
