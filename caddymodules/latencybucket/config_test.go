package latencybucket

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	"github.com/edgesteer/edgesteer/internal/pubsel"
)

// What the Caddyfile parser cannot see alone (options that depend on each
// other, the layer) fails at load through Validate, naming the option and
// value.
func TestCaddyfileValidate(t *testing.T) {
	for _, tc := range []struct {
		body   string
		layer4 bool
		want   string
	}{
		{"probe_host example.test", false, "latency_bucket: probe_path/probe_host example.test: apply to http, https and h2c probes only"},
		{"probe tls\nprobe_host example.test", false, "probe_path/probe_host example.test"},
		{"within least_conn", true, "latency_bucket: within least_conn: layer4 upstreams do not expose connection counts; use random or p2c"},
		{"traffic_half_life 5s", false, "latency_bucket: traffic_half_life 5s: applies to latency traffic or both, or within p2c, only"},
		{"within random\ntraffic_half_life 5s", true, "latency_bucket: traffic_half_life 5s: applies to latency traffic or both, or within p2c, only"},
		{"latency probe\ntraffic_failure_latency 1s", true, "latency_bucket: traffic_failure_latency 1s: applies to latency traffic or both, or within p2c, only"},
		{"sticky off\nsticky_store redis a", false, "latency_bucket: sticky_store redis a: needs sticky on"},
		{"sticky_store redis a\nsticky_store_timeout 6s", true, "latency_bucket: sticky_store_timeout 6s: must be at most 5s"},
		{"orca on", false, "latency_bucket: orca on: applies to within p2c only"},
		{"within p2c\norca on", true, "latency_bucket: orca on: layer4 answers carry no endpoint-load-metrics header; applies to HTTP only"},
		{"within p2c\norca off\norca_blackout 1s", false, "latency_bucket: orca_blackout 1s: applies with within p2c and orca on (HTTP) only"},
		{"within p2c\norca_expiration 1m", true, "latency_bucket: orca_expiration 1m0s: applies with within p2c and orca on (HTTP) only"},
		{"within random\norca_expiration 1m", false, "latency_bucket: orca_expiration 1m0s: applies with within p2c"},
		{"choices all", false, "latency_bucket: choices all: applies to within p2c only"},
		{"within random\nchoices 3", true, "latency_bucket: choices 3: applies to within p2c only"},
	} {
		t.Run(tc.body, func(t *testing.T) {
			var c Config
			err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser("latency_bucket {\n" + tc.body + "\n}"))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if err := c.Validate(tc.layer4); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// JSON with bad values fails validation the same way.
func TestBadJSONNamesOption(t *testing.T) {
	for raw, want := range map[string]string{
		`{"bucket_width": -1}`:                               "bucket_width",
		`{"probes": -2}`:                                     "probes",
		`{"probe": "ping"}`:                                  "probe",
		`{"latency": "traffik"}`:                             `latency "traffik": want probe, traffic, both, on or off`,
		`{"latency": "both", "traffic_half_life": "-1s"}`:    "traffic_half_life -1s: must be positive",
		`{"segments": {"a:1": "-4ms"}}`:                      "segment a:1",
		`{"sticky_max_entries": -1}`:                         "sticky_max_entries",
		`{"sticky_store": {}}`:                               `sticky_store "": name a store`,
		`{"sticky_store": {"redis": "a", "timeout": "-1s"}}`: "sticky_store_timeout -1s: must be positive",
		`{"within": "least_conn", "x": 1}`:                   "", // unknown JSON fields are Caddy's to reject
		`{"within": "p2c", "traffic_half_life": "1s"}`:       "",
		`{"slow_start": "-1s"}`:                              "slow_start -1s: must be positive",
		`{"within": "p2c", "orca": "yes"}`:                   `orca "yes": want on or off`,
		`{"within": "p2c", "orca_blackout": "-1s"}`:          "orca_blackout -1s: must not be negative",
		`{"within": "p2c", "orca_expiration": "-1s"}`:        "orca_expiration -1s: must be positive",
		`{"within": "p2c", "orca_blackout": "0s"}`:           "",
		`{"within": "leastconn"}`:                            `within "leastconn": want random, least_conn or p2c`,
		`{"within": "p2c", "choices": "1"}`:                  `choices "1": want a whole number of at least 2, or all`,
		`{"within": "p2c", "choices": "0"}`:                  `choices "0": want a whole number of at least 2, or all`,
		`{"within": "p2c", "choices": "x"}`:                  `choices "x": want a whole number of at least 2, or all`,
		`{"within": "least_conn", "choices": "all"}`:         "choices all: applies to within p2c only",
		`{"within": "p2c", "choices": "all"}`:                "",
		`{"within": "p2c", "choices": "3"}`:                  "",
	} {
		var c Config
		if err := json.Unmarshal([]byte(raw), &c); err != nil {
			t.Fatal(err)
		}
		err := c.Validate(false)
		if want == "" {
			if strings.Contains(raw, "choices") && err != nil {
				t.Errorf("%s: %v", raw, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", raw, err, want)
		}
	}
}

// The Caddyfile adapter puts the policy where reverse_proxy and layer4
// proxy expect it.
func TestAdaptCaddyfile(t *testing.T) {
	cf := `{
	layer4 {
		127.0.0.1:9000 {
			route {
				proxy 127.0.0.1:9101 127.0.0.1:9102 {
					lb_policy latency_bucket {
						probe tcp
						sticky_ttl 5m
					}
				}
			}
		}
		udp/127.0.0.1:9053 {
			route {
				proxy udp/127.0.0.1:9153 {
					lb_policy latency_bucket {
						udp_probe udp_hex abcd01 abcd
						log_decisions
					}
				}
			}
		}
	}
}
http://127.0.0.1:9200 {
	reverse_proxy 127.0.0.1:9101 127.0.0.1:9102 {
		lb_policy latency_bucket {
			bucket_width 16ms
			probe http /probe
		}
	}
}
http://127.0.0.1:9201 {
	reverse_proxy 127.0.0.1:9101 127.0.0.1:9102 {
		lb_policy latency_bucket {
			latency both
			traffic_half_life 5s
		}
		transport latency_bucket {
			transport http {
				dial_timeout 2s
			}
		}
	}
}`
	cfparsetest.Adapts(t, cf,
		`"selection_policy":{"bucket_width":16000000,"policy":"latency_bucket","probe":"http","probe_path":"/probe"}`,
		`"policy":"latency_bucket"`,
		`"sticky_ttl":300000000000`,
		`"selection":{"log_decisions":true,"policy":"latency_bucket","udp_probe":{"answer_hex":"abcd","request_hex":"abcd01"}}},"upstreams":[{"dial":["udp/127.0.0.1:9153"]}]`,
		`"selection_policy":{"latency":"both","policy":"latency_bucket","traffic_half_life":5000000000}`,
		`"transport":{"protocol":"latency_bucket","transport":{"dial_timeout":2000000000,"protocol":"http"}}`)
}

func TestProbeAddr(t *testing.T) {
	for dial, want := range map[string]string{
		"127.0.0.1:80":       "127.0.0.1:80",
		"tcp/10.0.0.1:443":   "10.0.0.1:443",
		"[::1]:8080":         "[::1]:8080",
		"udp/10.0.0.1:53":    "udp/10.0.0.1:53",
		"udp4/10.0.0.1:53":   "udp/10.0.0.1:53",
		"unix//run/app.sock": "",
		"{env.UP}:80":        "",
		"10.0.0.1:80-81":     "",
	} {
		if got := probeAddr(dial); got != want {
			t.Errorf("probeAddr(%q) = %q, want %q", dial, got, want)
		}
	}
}

// choices reaches the engine as Selector.Choices: 2 unless given, all as
// pubsel.ChoicesAll.
func TestChoicesSetting(t *testing.T) {
	for v, want := range map[string]int{"": 2, "2": 2, "3": 3, "all": pubsel.ChoicesAll} {
		c := Config{Within: "p2c", Choices: v}
		if err := c.Validate(false); err != nil {
			t.Fatalf("choices %q: %v", v, err)
		}
		if got := c.choices(); got != want {
			t.Errorf("choices %q: engine gets %d, want %d", v, got, want)
		}
	}
}
