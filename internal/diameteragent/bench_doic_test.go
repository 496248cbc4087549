package diameteragent

import (
	"strconv"
	"testing"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
)

// BenchmarkDOIC is BenchmarkRouteAndAnswer's path (10 000 sessions, the
// answer scanned as the upstream reader does) with DOIC off and on, in the
// same run: on, the request gets the agent's OC-Supported-Features, the
// server's answer carries its own OC-Supported-Features (taken out) and
// the answer goes back with the agent's Load. Messages/s ratio = ns/op
// off ÷ ns/op on.
func BenchmarkDOIC(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			cfg := baseConfig()
			if mode != "off" {
				cfg.DOIC = &DOIC{}
			}
			a, d := benchAgent(b, cfg)
			const sessions = 10_000
			msgs := make([][]byte, sessions)
			for i := range msgs {
				msgs[i] = req{app: diameter.AppGx, ccType: 2, session: "pgw1.example;" + strconv.Itoa(i), e2e: uint32(i)}.bytes(b)
			}
			answer := withAVPs(req{app: diameter.AppGx, ccType: 2, session: "x", e2e: 1}.bytes(b), doic.EncodeSupported(doic.FeatureLoss, ""))
			answer[4] &^= 0x80
			var ans msgInfo
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				routeAndAnswer(b, a, d, msgs[i%sessions], answer, &ans)
			}
		})
	}
}
