package latencybucket

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"
)

func TestUnmarshalCaddyfileAllOptions(t *testing.T) {
	d := caddyfile.NewTestDispenser(`latency_bucket {
		name apps
		latency on
		bucket_width 20ms
		hysteresis 0.2
		within least_conn
		probe https /healthz
		probe_host example.test
		probe_insecure_skip_verify
		probes 5
		probe_interval 2s
		probe_timeout 500ms
		probe_window 4
		segment 10.0.0.1:443 15ms
		segment 10.0.0.2:443 0
		sticky on
		sticky_user {http.request.header.X-User}
		sticky_user_fallback none
		sticky_app {http.request.host}
		sticky_ttl 10m
		sticky_max_entries 5000
	}`)
	var c Config
	if err := c.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	h := 0.2
	want := Config{
		Name: "apps", Latency: "on", BucketWidth: caddy.Duration(20 * time.Millisecond), Hysteresis: &h,
		Within: "least_conn", Probe: "https", ProbePath: "/healthz", ProbeHost: "example.test",
		ProbeInsecureSkipVerify: true, Probes: 5, ProbeInterval: caddy.Duration(2 * time.Second),
		ProbeTimeout: caddy.Duration(500 * time.Millisecond), ProbeWindow: 4,
		Segments: map[string]caddy.Duration{"10.0.0.1:443": caddy.Duration(15 * time.Millisecond), "10.0.0.2:443": 0},
		Sticky:   "on", StickyUser: "{http.request.header.X-User}", StickyUserFallback: "none",
		StickyApp: "{http.request.host}", StickyTTL: caddy.Duration(10 * time.Minute), StickyMaxEntries: 5000,
	}
	got, _ := json.Marshal(c)
	exp, _ := json.Marshal(want)
	if string(got) != string(exp) {
		t.Fatalf("got  %s\nwant %s", got, exp)
	}
	if err := c.Validate(false); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(true); err == nil || !strings.Contains(err.Error(), "within") {
		t.Fatalf("least_conn in layer4: %v", err)
	}
}

// Bad config fails at load and names the option and value.
func TestBadConfigNamesOption(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"bucket_width 0", "bucket_width 0: must be positive"},
		{"bucket_width -5ms", "bucket_width -5ms"},
		{"probes 0", "probes 0: must be at least 1"},
		{"probes three", `probes "three"`},
		{"segment 10.0.0.1:443 -3ms", "segment"},
		{"probe icmp", `probe "icmp": unknown probe kind`},
		{"latency maybe", `latency "maybe"`},
		{"within fastest", `within "fastest"`},
		{"hysteresis 1.5", "hysteresis 1.5"},
		{"no_such_option 1", `unknown option "no_such_option"`},
		{"probe_path /x", "unknown option"},
		{"probe tcp /x", "probe_path/probe_host"},
		{"sticky sometimes", `sticky "sometimes"`},
		{"sticky_user_fallback anonymous", `sticky_user_fallback "anonymous": want client_ip or none`},
	} {
		t.Run(tc.body, func(t *testing.T) {
			var c Config
			err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser("latency_bucket {\n" + tc.body + "\n}"))
			if err == nil {
				err = c.Validate(false)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// JSON with bad values fails validation the same way.
func TestBadJSONNamesOption(t *testing.T) {
	for raw, want := range map[string]string{
		`{"bucket_width": -1}`:             "bucket_width",
		`{"probes": -2}`:                   "probes",
		`{"probe": "ping"}`:                "probe",
		`{"segments": {"a:1": "-4ms"}}`:    "segment a:1",
		`{"sticky_max_entries": -1}`:       "sticky_max_entries",
		`{"within": "least_conn", "x": 1}`: "", // unknown JSON fields are Caddy's to reject
	} {
		var c Config
		if err := json.Unmarshal([]byte(raw), &c); err != nil {
			t.Fatal(err)
		}
		err := c.Validate(false)
		if want == "" {
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
	}
}
http://127.0.0.1:9200 {
	reverse_proxy 127.0.0.1:9101 127.0.0.1:9102 {
		lb_policy latency_bucket {
			bucket_width 16ms
			probe http /probe
		}
	}
}`
	out, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatalf("adapt: %v %v", err, warn)
	}
	js := string(out)
	for _, want := range []string{
		`"selection_policy":{"bucket_width":16000000,"policy":"latency_bucket","probe":"http","probe_path":"/probe"}`,
		`"policy":"latency_bucket"`,
		`"sticky_ttl":300000000000`,
	} {
		if !strings.Contains(js, want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, js)
		}
	}
}

func TestProbeAddr(t *testing.T) {
	for dial, want := range map[string]string{
		"127.0.0.1:80":       "127.0.0.1:80",
		"tcp/10.0.0.1:443":   "10.0.0.1:443",
		"[::1]:8080":         "[::1]:8080",
		"udp/10.0.0.1:53":    "",
		"unix//run/app.sock": "",
		"{env.UP}:80":        "",
		"10.0.0.1:80-81":     "",
	} {
		if got := probeAddr(dial); got != want {
			t.Errorf("probeAddr(%q) = %q, want %q", dial, got, want)
		}
	}
}
