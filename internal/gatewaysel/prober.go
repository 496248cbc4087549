package gatewaysel

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
)

// ExchangeProbeTimeout is the default probe timeout of the tls, http and
// https probes (a handshake or an exchange takes several round trips).
const ExchangeProbeTimeout = 2 * time.Second

// NewProber returns the prober of a probe kind as the plugin's `probe`
// option builds it (tcp, tls, http, https; path for http and https), and
// its default probe timeout; the reporter measures with the same code.
func NewProber(kind, path string, verify, checkStatus bool) (latency.Prober, time.Duration, error) {
	tlsCfg := &tls.Config{InsecureSkipVerify: !verify} //nolint:gosec // latency probe; opt in to verification
	switch kind {
	case "tcp":
		return latency.TCPProber{}, DefaultProbeTimeout, nil
	case "tls":
		return latency.TLSProber{Config: tlsCfg}, ExchangeProbeTimeout, nil
	case "http", "https":
		// Each probe its own connection, timed from the SYN to the end of
		// the exchange, as AnyConnect times SYN to FIN/ACK.
		// Any HTTP answer completes the probe, as AnyConnect counts the
		// answer itself (CSCtg38672); checkStatus fails a 5xx instead.
		p := latency.NewHTTPProber(kind, path, "", tlsCfg, true)
		p.AnyStatus = !checkStatus
		return p, ExchangeProbeTimeout, nil
	}
	return nil, 0, fmt.Errorf("probe %q: want tcp, tls, http or https", kind)
}
