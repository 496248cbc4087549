package latencybucket

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestUnmarshalCaddyfile runs in the CoreDNS setup_test style: each input
// either parses to the expected JSON config or fails with the expected text,
// which carries the module, option, value, file and line.
func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		input       string
		expected    string // the JSON config
		expectedErr string // empty: must parse
	}{
		{input: "latency_bucket", expected: `{}`},
		{input: "latency_bucket {\n}", expected: `{}`},
		{input: `latency_bucket {
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
		}`, expected: `{"name":"apps","latency":"on","bucket_width":20000000,"hysteresis":0.2,"within":"least_conn",` +
			`"probe":"https","probe_path":"/healthz","probe_host":"example.test","probe_insecure_skip_verify":true,` +
			`"probes":5,"probe_interval":2000000000,"probe_timeout":500000000,"probe_window":4,` +
			`"segments":{"10.0.0.1:443":15000000,"10.0.0.2:443":0},"sticky":"on",` +
			`"sticky_user":"{http.request.header.X-User}","sticky_app":"{http.request.host}",` +
			`"sticky_user_fallback":"none","sticky_ttl":600000000000,"sticky_max_entries":5000}`},
		{input: "latency_bucket {\nlatency off\nhysteresis 0\nprobe tcp\nsticky off\nsticky_ttl 1d\n}",
			expected: `{"latency":"off","hysteresis":0,"probe":"tcp","sticky":"off","sticky_ttl":86400000000000}`},
		{input: "latency_bucket {\nprobe h2c\nwithin random\nsticky_user_fallback client_ip\n}",
			expected: `{"within":"random","probe":"h2c","sticky_user_fallback":"client_ip"}`},

		// Loose numbers, durations and words.
		{input: "latency_bucket {\nprobes 3x\n}", expectedErr: `latency_bucket: probes "3x": want a whole number of at least 1, at Testfile:2`},
		{input: "latency_bucket {\nprobes 0x10\n}", expectedErr: `latency_bucket: probes "0x10": want a whole number of at least 1, at Testfile:2`},
		{input: "latency_bucket {\nprobes 0\n}", expectedErr: `latency_bucket: probes "0": want a whole number of at least 1`},
		{input: "latency_bucket {\nprobes three\n}", expectedErr: `latency_bucket: probes "three"`},
		{input: "latency_bucket {\nprobe_window 1_000\n}", expectedErr: `latency_bucket: probe_window "1_000": want a whole number of at least 1, at Testfile:2`},
		{input: "latency_bucket {\nsticky_max_entries 100k\n}", expectedErr: `latency_bucket: sticky_max_entries "100k": want a whole number of at least 1`},
		{input: "latency_bucket {\nsticky_max_entries -1\n}", expectedErr: `latency_bucket: sticky_max_entries "-1"`},
		{input: "latency_bucket {\nhysteresis 0x1p-2\n}", expectedErr: `latency_bucket: hysteresis "0x1p-2": want a decimal number of at least 0 and below 1, at Testfile:2`},
		{input: "latency_bucket {\nhysteresis 0.2x\n}", expectedErr: `latency_bucket: hysteresis "0.2x"`},
		{input: "latency_bucket {\nhysteresis 1\n}", expectedErr: `latency_bucket: hysteresis "1": want a decimal number of at least 0 and below 1`},
		{input: "latency_bucket {\nhysteresis 1.5\n}", expectedErr: `latency_bucket: hysteresis "1.5"`},
		{input: "latency_bucket {\nhysteresis -0.1\n}", expectedErr: `latency_bucket: hysteresis "-0.1"`},
		{input: "latency_bucket {\nhysteresis NaN\n}", expectedErr: `latency_bucket: hysteresis "NaN"`},
		{input: "latency_bucket {\nbucket_width 32\n}", expectedErr: `latency_bucket: bucket_width "32": want a positive duration, such as 250ms, 30s or 1d, at Testfile:2`},
		{input: "latency_bucket {\nbucket_width 0\n}", expectedErr: `latency_bucket: bucket_width "0": want a positive duration`},
		{input: "latency_bucket {\nbucket_width -5ms\n}", expectedErr: `latency_bucket: bucket_width "-5ms": want a positive duration`},
		{input: "latency_bucket {\nprobe_interval 10sx\n}", expectedErr: `latency_bucket: probe_interval "10sx"`},
		{input: "latency_bucket {\nprobe_timeout 0s\n}", expectedErr: `latency_bucket: probe_timeout "0s": want a positive duration`},
		{input: "latency_bucket {\nsticky_ttl 1h0x\n}", expectedErr: `latency_bucket: sticky_ttl "1h0x"`},
		{input: "latency_bucket {\nsegment 10.0.0.1:443 -3ms\n}", expectedErr: `latency_bucket: segment 10.0.0.1:443 "-3ms": want a duration of zero or more, such as 0s, 250ms or 1d, at Testfile:2`},
		{input: "latency_bucket {\nsegment 10.0.0.1:443 40\n}", expectedErr: `latency_bucket: segment 10.0.0.1:443 "40": want a duration of zero or more`},
		{input: "latency_bucket {\nlatency maybe\n}", expectedErr: `latency_bucket: latency "maybe": want on or off, at Testfile:2`},
		{input: "latency_bucket {\nlatency true\n}", expectedErr: `latency_bucket: latency "true": want on or off`},
		{input: "latency_bucket {\nwithin fastest\n}", expectedErr: `latency_bucket: within "fastest": want random or least_conn, at Testfile:2`},
		{input: "latency_bucket {\nprobe icmp\n}", expectedErr: `latency_bucket: probe "icmp": want tcp, tls, http, https or h2c, at Testfile:2`},
		{input: "latency_bucket {\nprobe HTTP /x\n}", expectedErr: `latency_bucket: probe "HTTP"`},
		{input: "latency_bucket {\nsticky sometimes\n}", expectedErr: `latency_bucket: sticky "sometimes": want on or off, at Testfile:2`},
		{input: "latency_bucket {\nsticky_user_fallback anonymous\n}", expectedErr: `latency_bucket: sticky_user_fallback "anonymous": want client_ip or none, at Testfile:2`},
		{input: "latency_bucket {\nprobe tcp /x\n}", expectedErr: "latency_bucket: probe: tcp /x: a path applies to http, https and h2c probes only, at Testfile:2"},

		// Extra and missing arguments, blocks after options that take none.
		{input: "latency_bucket apps", expectedErr: "latency_bucket: want no arguments, got 1: apps, at Testfile:1"},
		{input: "latency_bucket {\nname a b\n}", expectedErr: "latency_bucket: name: want 1 argument, got 2: a b, at Testfile:2"},
		{input: "latency_bucket {\nname\n}", expectedErr: "latency_bucket: name: want 1 argument, got none, at Testfile:2"},
		{input: "latency_bucket {\nprobes 3 4\n}", expectedErr: "latency_bucket: probes: want 1 argument, got 2: 3 4, at Testfile:2"},
		{input: "latency_bucket {\nbucket_width 20ms 40ms\n}", expectedErr: "latency_bucket: bucket_width: want 1 argument, got 2: 20ms 40ms"},
		{input: "latency_bucket {\nlatency on off\n}", expectedErr: "latency_bucket: latency: want 1 argument, got 2: on off"},
		{input: "latency_bucket {\nhysteresis\n}", expectedErr: "latency_bucket: hysteresis: want 1 argument, got none"},
		{input: "latency_bucket {\nsticky_user {http.request.header.X-User} {http.request.host}\n}", expectedErr: "latency_bucket: sticky_user: want 1 argument, got 2"},
		{input: "latency_bucket {\nprobe\n}", expectedErr: "latency_bucket: probe: want 1 to 2 arguments, got none, at Testfile:2"},
		{input: "latency_bucket {\nprobe http /a /b\n}", expectedErr: "latency_bucket: probe: want 1 to 2 arguments, got 3: http /a /b, at Testfile:2"},
		{input: "latency_bucket {\nprobe_insecure_skip_verify true\n}", expectedErr: "latency_bucket: probe_insecure_skip_verify: want no arguments, got 1: true, at Testfile:2"},
		{input: "latency_bucket {\nsegment 10.0.0.1:443\n}", expectedErr: "latency_bucket: segment: want 2 arguments, got 1: 10.0.0.1:443, at Testfile:2"},
		{input: "latency_bucket {\nsegment 10.0.0.1:443 15ms 20ms\n}", expectedErr: "latency_bucket: segment: want 2 arguments, got 3: 10.0.0.1:443 15ms 20ms"},
		{input: "latency_bucket {\nsticky_ttl 1h {\nx\n}\n}", expectedErr: "latency_bucket: sticky_ttl takes no block, at Testfile:2"},
		{input: "latency_bucket {\nprobe http {\npath /x\n}\n}", expectedErr: "latency_bucket: probe takes no block, at Testfile:2"},

		// Repeats: segment once per address, every other option once.
		{input: "latency_bucket {\nprobes 2\nprobes 3\n}", expectedErr: "latency_bucket: probes given twice (first at Testfile:2), at Testfile:3"},
		{input: "latency_bucket {\nname a\nprobes 2\nname b\n}", expectedErr: "latency_bucket: name given twice (first at Testfile:2), at Testfile:4"},
		{input: "latency_bucket {\nbucket_width 20ms\nbucket_width 20ms\n}", expectedErr: "latency_bucket: bucket_width given twice"},
		{input: "latency_bucket {\nhysteresis 0.1\nhysteresis 0.2\n}", expectedErr: "latency_bucket: hysteresis given twice"},
		{input: "latency_bucket {\nprobe http /a\nprobe tcp\n}", expectedErr: "latency_bucket: probe given twice (first at Testfile:2), at Testfile:3"},
		{input: "latency_bucket {\nprobe_insecure_skip_verify\nprobe_insecure_skip_verify\n}", expectedErr: "latency_bucket: probe_insecure_skip_verify given twice"},
		{input: "latency_bucket {\nsticky on\nsticky off\n}", expectedErr: "latency_bucket: sticky given twice"},
		{input: "latency_bucket {\nsticky_user {a}\nsticky_user {b}\n}", expectedErr: "latency_bucket: sticky_user given twice"},
		{input: "latency_bucket {\nsegment 10.0.0.1:443 5ms\nsegment 10.0.0.2:443 5ms\nsegment 10.0.0.1:443 9ms\n}",
			expectedErr: "latency_bucket: segment 10.0.0.1:443 given twice (first at Testfile:2), at Testfile:4"},

		{input: "latency_bucket {\nprobe_path /x\n}", expectedErr: `latency_bucket: unknown option "probe_path", at Testfile:2`},
		{input: "latency_bucket {\nno_such_option 1\n}", expectedErr: `latency_bucket: unknown option "no_such_option", at Testfile:2`},
	}
	for i, test := range tests {
		var c Config
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v", i, test.expectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
			continue
		}
		if got, _ := json.Marshal(c); string(got) != test.expected {
			t.Errorf("test %d: got %s\nwant %s", i, got, test.expected)
		}
		if err := c.Validate(false); err != nil {
			t.Errorf("test %d: parsed but fails validation: %v", i, err)
		}
	}
}
