package gatewaysel

import (
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

// rep is a report measured at at: gateway name, then an RTT or "fail".
func rep(at time.Time, kv ...any) rttreports.Report {
	out := rttreports.Report{Probe: "https", At: at}
	for i := 0; i < len(kv); i += 2 {
		m := rttreports.Measurement{Gateway: kv[i].(string)}
		switch v := kv[i+1].(type) {
		case time.Duration:
			m.RTT = v
		case string: // "fail"
			m.Failed = true
		}
		out.Measurements = append(out.Measurements, m)
	}
	return out
}

const ms = time.Millisecond

// pick returns a Selection's order and source.
func pick(s Selection) (*gatewayorder.Result, Source) { return s.Result, s.Source }
