package latencybucket

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

// udp_probe and log_decisions (layer4 options): each form parses to its
// JSON, and a bad one names the option and the value.
func TestUnmarshalUDPProbe(t *testing.T) {
	tests := []cfparsetest.Case{
		{Input: "latency_bucket {\nudp_probe tcp 8443\n}", Expected: `{"udp_probe":{"tcp_port":8443}}`},
		{Input: "latency_bucket {\nudp_probe udp ping pong\n}", Expected: `{"udp_probe":{"request":"ping","answer":"pong"}}`},
		{Input: "latency_bucket {\nudp_probe udp \"status please\"\n}", Expected: `{"udp_probe":{"request":"status please"}}`},
		{Input: "latency_bucket {\nudp_probe udp_hex 00ff 00\n}", Expected: `{"udp_probe":{"request_hex":"00ff","answer_hex":"00"}}`},
		{Input: "latency_bucket {\nlog_decisions\n}", Expected: `{"log_decisions":true}`},
		{Input: "latency_bucket {\nudp_probe tcp 70000\n}", ExpectedErr: `latency_bucket: udp_probe "70000": want a whole number from 1 to 65535, at Testfile:2`},
		{Input: "latency_bucket {\nudp_probe tcp 53 x\n}", ExpectedErr: `latency_bucket: udp_probe: tcp takes one port, got 53 x, at Testfile:2`},
		{Input: "latency_bucket {\nudp_probe icmp x\n}", ExpectedErr: `latency_bucket: udp_probe "icmp": want tcp, udp or udp_hex, at Testfile:2`},
		{Input: "latency_bucket {\nudp_probe udp_hex zz\n}", ExpectedErr: `latency_bucket: udp_probe request_hex "zz": not hexadecimal`},
		{Input: "latency_bucket {\nudp_probe udp\n}", ExpectedErr: `latency_bucket: udp_probe: want 2 to 3 arguments, got 1: udp, at Testfile:2`},
		{Input: "latency_bucket {\nudp_probe udp " + strings.Repeat("x", 1025) + "\n}", ExpectedErr: `latency_bucket: udp_probe request (1025 bytes): at most 1024 bytes`},
		{Input: "latency_bucket {\nudp_probe udp a b\nudp_probe tcp 1\n}", ExpectedErr: `latency_bucket: udp_probe given twice (first at Testfile:2), at Testfile:3`},
		{Input: "latency_bucket {\nlog_decisions on\n}", ExpectedErr: `latency_bucket: log_decisions: want no arguments, got 1: on, at Testfile:2`},
	}
	cfparsetest.Check(t, func() *Config { return new(Config) }, tests, func(c *Config) error { return c.Validate(true) })
}

// JSON: the same rules through Validate; both options are layer4 only.
func TestUDPProbeJSONNamesOption(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		layer4 bool
		want   string
	}{
		{`{"udp_probe": {"tcp_port": 8443}}`, true, ""},
		{`{"udp_probe": {"request": "ping"}, "log_decisions": true}`, true, ""},
		{`{"udp_probe": {"tcp_port": 99999}}`, true, "udp_probe tcp 99999: want a port from 1 to 65535"},
		{`{"udp_probe": {"tcp_port": 53, "request": "x"}}`, true, "udp_probe tcp 53: give a TCP port or a request and answer, not both"},
		{`{"udp_probe": {}}`, true, "udp_probe: give tcp <port>, or udp <request> [<answer>]"},
		{`{"udp_probe": {"answer": "x"}}`, true, "udp_probe: give tcp <port>"},
		{`{"udp_probe": {"request": "a", "request_hex": "61"}}`, true, `udp_probe request "a": give request or request_hex, not both`},
		{`{"udp_probe": {"request": "a", "answer": "b", "answer_hex": "62"}}`, true, `udp_probe answer "b": give answer or answer_hex, not both`},
		{`{"udp_probe": {"request": "a", "answer_hex": "6"}}`, true, `udp_probe answer_hex "6": not hexadecimal`},
		{`{"udp_probe": {"request": "a", "answer": "` + strings.Repeat("b", 513) + `"}}`, true, `udp_probe answer (513 bytes): at most 512 bytes`},
		{`{"udp_probe": {"tcp_port": 53}}`, false, "udp_probe: applies to layer4 proxies"},
		{`{"log_decisions": true}`, false, "log_decisions true: layer4 only"},
	} {
		var c Config
		if err := json.Unmarshal([]byte(tc.raw), &c); err != nil {
			t.Fatal(err)
		}
		err := c.Validate(tc.layer4)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.raw, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.raw, err, tc.want)
		}
	}
}

// A UDP upstream without udp_probe is refused at load, naming it.
func TestUDPUpstreamNeedsUDPProbe(t *testing.T) {
	var c Config
	err := c.checkUDPUpstreams(probeAddrs([]string{"10.0.0.1:443", "udp/10.0.0.2:53"}))
	if err == nil || !strings.Contains(err.Error(), "upstream udp/10.0.0.2:53: a UDP upstream needs udp_probe") {
		t.Fatalf("got %v", err)
	}
	c.UDPProbe = &UDPProbe{TCPPort: 53}
	if err := c.checkUDPUpstreams(probeAddrs([]string{"udp/10.0.0.2:53"})); err != nil {
		t.Fatal(err)
	}
}
