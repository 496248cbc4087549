package latencybucket

import (
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

// TestUnmarshalCaddyfile runs in the CoreDNS setup_test style: each input
// either parses to the expected JSON config or fails with the expected text,
// which carries the module, option, value, file and line.
func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []cfparsetest.Case{
		{Input: "latency_bucket", Expected: `{}`},
		{Input: "latency_bucket {\n}", Expected: `{}`},
		{Input: `latency_bucket {
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
		}`, Expected: `{"name":"apps","latency":"on","bucket_width":20000000,"hysteresis":0.2,"within":"least_conn",` +
			`"probe":"https","probe_path":"/healthz","probe_host":"example.test","probe_insecure_skip_verify":true,` +
			`"probes":5,"probe_interval":2000000000,"probe_timeout":500000000,"probe_window":4,` +
			`"segments":{"10.0.0.1:443":15000000,"10.0.0.2:443":0},"sticky":"on",` +
			`"sticky_user":"{http.request.header.X-User}","sticky_app":"{http.request.host}",` +
			`"sticky_user_fallback":"none","sticky_ttl":600000000000,"sticky_max_entries":5000}`},
		{Input: "latency_bucket {\nlatency off\nhysteresis 0\nprobe tcp\nsticky off\nsticky_ttl 1d\n}",
			Expected: `{"latency":"off","hysteresis":0,"probe":"tcp","sticky":"off","sticky_ttl":86400000000000}`},
		{Input: "latency_bucket {\nlatency traffic\ntraffic_half_life 5s\ntraffic_failure_latency 3s\n}",
			Expected: `{"latency":"traffic","traffic_half_life":5000000000,"traffic_failure_latency":3000000000}`},
		{Input: "latency_bucket {\nlatency both\n}", Expected: `{"latency":"both"}`},
		{Input: "latency_bucket {\nlatency probe\n}", Expected: `{"latency":"probe"}`},
		{Input: "latency_bucket {\nlatency observed\n}", ExpectedErr: `latency_bucket: latency "observed": want probe, traffic, both, on or off, at Testfile:2`},
		{Input: "latency_bucket {\nlatency traffic\ntraffic_half_life 0\n}", ExpectedErr: `latency_bucket: traffic_half_life "0"`},
		{Input: "latency_bucket {\nprobe h2c\nwithin random\nsticky_user_fallback client_ip\n}",
			Expected: `{"within":"random","probe":"h2c","sticky_user_fallback":"client_ip"}`},

		// Loose numbers, durations and words.
		{Input: "latency_bucket {\nprobes 3x\n}", ExpectedErr: `latency_bucket: probes "3x": want a whole number of at least 1, at Testfile:2`},
		{Input: "latency_bucket {\nprobes 0x10\n}", ExpectedErr: `latency_bucket: probes "0x10": want a whole number of at least 1, at Testfile:2`},
		{Input: "latency_bucket {\nprobes 0\n}", ExpectedErr: `latency_bucket: probes "0": want a whole number of at least 1`},
		{Input: "latency_bucket {\nprobes three\n}", ExpectedErr: `latency_bucket: probes "three"`},
		{Input: "latency_bucket {\nprobe_window 1_000\n}", ExpectedErr: `latency_bucket: probe_window "1_000": want a whole number of at least 1, at Testfile:2`},
		{Input: "latency_bucket {\nsticky_max_entries 100k\n}", ExpectedErr: `latency_bucket: sticky_max_entries "100k": want a whole number of at least 1`},
		{Input: "latency_bucket {\nsticky_max_entries -1\n}", ExpectedErr: `latency_bucket: sticky_max_entries "-1"`},
		{Input: "latency_bucket {\nhysteresis 0x1p-2\n}", ExpectedErr: `latency_bucket: hysteresis "0x1p-2": want a decimal number of at least 0 and below 1, at Testfile:2`},
		{Input: "latency_bucket {\nhysteresis 0.2x\n}", ExpectedErr: `latency_bucket: hysteresis "0.2x"`},
		{Input: "latency_bucket {\nhysteresis 1\n}", ExpectedErr: `latency_bucket: hysteresis "1": want a decimal number of at least 0 and below 1`},
		{Input: "latency_bucket {\nhysteresis 1.5\n}", ExpectedErr: `latency_bucket: hysteresis "1.5"`},
		{Input: "latency_bucket {\nhysteresis -0.1\n}", ExpectedErr: `latency_bucket: hysteresis "-0.1"`},
		{Input: "latency_bucket {\nhysteresis NaN\n}", ExpectedErr: `latency_bucket: hysteresis "NaN"`},
		{Input: "latency_bucket {\nbucket_width 32\n}", ExpectedErr: `latency_bucket: bucket_width "32": want a positive duration, such as 250ms, 30s or 1d, at Testfile:2`},
		{Input: "latency_bucket {\nbucket_width 0\n}", ExpectedErr: `latency_bucket: bucket_width "0": want a positive duration`},
		{Input: "latency_bucket {\nbucket_width -5ms\n}", ExpectedErr: `latency_bucket: bucket_width "-5ms": want a positive duration`},
		{Input: "latency_bucket {\nprobe_interval 10sx\n}", ExpectedErr: `latency_bucket: probe_interval "10sx"`},
		{Input: "latency_bucket {\nprobe_timeout 0s\n}", ExpectedErr: `latency_bucket: probe_timeout "0s": want a positive duration`},
		{Input: "latency_bucket {\nsticky_ttl 1h0x\n}", ExpectedErr: `latency_bucket: sticky_ttl "1h0x"`},
		{Input: "latency_bucket {\nsegment 10.0.0.1:443 -3ms\n}", ExpectedErr: `latency_bucket: segment 10.0.0.1:443 "-3ms": want a duration of zero or more, such as 0s, 250ms or 1d, at Testfile:2`},
		{Input: "latency_bucket {\nsegment 10.0.0.1:443 40\n}", ExpectedErr: `latency_bucket: segment 10.0.0.1:443 "40": want a duration of zero or more`},
		{Input: "latency_bucket {\nlatency maybe\n}", ExpectedErr: `latency_bucket: latency "maybe": want probe, traffic, both, on or off, at Testfile:2`},
		{Input: "latency_bucket {\nlatency true\n}", ExpectedErr: `latency_bucket: latency "true": want probe, traffic, both, on or off`},
		{Input: "latency_bucket {\nwithin fastest\n}", ExpectedErr: `latency_bucket: within "fastest": want random, least_conn or p2c, at Testfile:2`},
		{Input: "latency_bucket {\nwithin p2c\n}", Expected: `{"within":"p2c"}`},
		{Input: "latency_bucket {\nwithin p2c\nchoices all\n}", Expected: `{"within":"p2c","choices":"all"}`},
		{Input: "latency_bucket {\nwithin p2c\nchoices 3\n}", Expected: `{"within":"p2c","choices":"3"}`},
		{Input: "latency_bucket {\nwithin p2c\nchoices 1\n}", ExpectedErr: `latency_bucket: choices "1": want a whole number of at least 2, or all, at Testfile:3`},
		{Input: "latency_bucket {\nwithin p2c\nchoices 0\n}", ExpectedErr: `latency_bucket: choices "0": want a whole number of at least 2, or all`},
		{Input: "latency_bucket {\nwithin p2c\nchoices x\n}", ExpectedErr: `latency_bucket: choices "x": want a whole number of at least 2, or all`},
		{Input: "latency_bucket {\nwithin p2c\nchoices\n}", ExpectedErr: `latency_bucket: choices`},
		{Input: "latency_bucket {\nchoices 2\nchoices 3\n}", ExpectedErr: `latency_bucket: choices`},
		{Input: "latency_bucket {\nslow_start 30s\n}", Expected: `{"slow_start":30000000000}`},
		{Input: "latency_bucket {\nwithin p2c\norca off\n}", Expected: `{"within":"p2c","orca":"off"}`},
		{Input: "latency_bucket {\nwithin p2c\norca_blackout 0\norca_expiration 2s\n}",
			Expected: `{"within":"p2c","orca_blackout":0,"orca_expiration":2000000000}`},
		{Input: "latency_bucket {\nprobe icmp\n}", ExpectedErr: `latency_bucket: probe "icmp": want tcp, tls, http, https or h2c, at Testfile:2`},
		{Input: "latency_bucket {\nprobe HTTP /x\n}", ExpectedErr: `latency_bucket: probe "HTTP"`},
		{Input: "latency_bucket {\nsticky sometimes\n}", ExpectedErr: `latency_bucket: sticky "sometimes": want on or off, at Testfile:2`},
		{Input: "latency_bucket {\nsticky_user_fallback anonymous\n}", ExpectedErr: `latency_bucket: sticky_user_fallback "anonymous": want client_ip or none, at Testfile:2`},
		{Input: "latency_bucket {\nprobe tcp /x\n}", ExpectedErr: "latency_bucket: probe: tcp /x: a path applies to http, https and h2c probes only, at Testfile:2"},

		// Extra and missing arguments, blocks after options that take none.
		{Input: "latency_bucket apps", ExpectedErr: "latency_bucket: want no arguments, got 1: apps, at Testfile:1"},
		{Input: "latency_bucket {\nname a b\n}", ExpectedErr: "latency_bucket: name: want 1 argument, got 2: a b, at Testfile:2"},
		{Input: "latency_bucket {\nname\n}", ExpectedErr: "latency_bucket: name: want 1 argument, got none, at Testfile:2"},
		{Input: "latency_bucket {\nprobes 3 4\n}", ExpectedErr: "latency_bucket: probes: want 1 argument, got 2: 3 4, at Testfile:2"},
		{Input: "latency_bucket {\nbucket_width 20ms 40ms\n}", ExpectedErr: "latency_bucket: bucket_width: want 1 argument, got 2: 20ms 40ms"},
		{Input: "latency_bucket {\nlatency on off\n}", ExpectedErr: "latency_bucket: latency: want 1 argument, got 2: on off"},
		{Input: "latency_bucket {\nhysteresis\n}", ExpectedErr: "latency_bucket: hysteresis: want 1 argument, got none"},
		{Input: "latency_bucket {\nsticky_user {http.request.header.X-User} {http.request.host}\n}", ExpectedErr: "latency_bucket: sticky_user: want 1 argument, got 2"},
		{Input: "latency_bucket {\nprobe\n}", ExpectedErr: "latency_bucket: probe: want 1 to 2 arguments, got none, at Testfile:2"},
		{Input: "latency_bucket {\nprobe http /a /b\n}", ExpectedErr: "latency_bucket: probe: want 1 to 2 arguments, got 3: http /a /b, at Testfile:2"},
		{Input: "latency_bucket {\nprobe_insecure_skip_verify true\n}", ExpectedErr: "latency_bucket: probe_insecure_skip_verify: want no arguments, got 1: true, at Testfile:2"},
		{Input: "latency_bucket {\nsegment 10.0.0.1:443\n}", ExpectedErr: "latency_bucket: segment: want 2 arguments, got 1: 10.0.0.1:443, at Testfile:2"},
		{Input: "latency_bucket {\nsegment 10.0.0.1:443 15ms 20ms\n}", ExpectedErr: "latency_bucket: segment: want 2 arguments, got 3: 10.0.0.1:443 15ms 20ms"},
		{Input: "latency_bucket {\nsticky_ttl 1h {\nx\n}\n}", ExpectedErr: "latency_bucket: sticky_ttl takes no block, at Testfile:2"},
		{Input: "latency_bucket {\nprobe http {\npath /x\n}\n}", ExpectedErr: "latency_bucket: probe takes no block, at Testfile:2"},

		// Repeats: segment once per address, every other option once.
		{Input: "latency_bucket {\nprobes 2\nprobes 3\n}", ExpectedErr: "latency_bucket: probes given twice (first at Testfile:2), at Testfile:3"},
		{Input: "latency_bucket {\nname a\nprobes 2\nname b\n}", ExpectedErr: "latency_bucket: name given twice (first at Testfile:2), at Testfile:4"},
		{Input: "latency_bucket {\nbucket_width 20ms\nbucket_width 20ms\n}", ExpectedErr: "latency_bucket: bucket_width given twice"},
		{Input: "latency_bucket {\nhysteresis 0.1\nhysteresis 0.2\n}", ExpectedErr: "latency_bucket: hysteresis given twice"},
		{Input: "latency_bucket {\nprobe http /a\nprobe tcp\n}", ExpectedErr: "latency_bucket: probe given twice (first at Testfile:2), at Testfile:3"},
		{Input: "latency_bucket {\nprobe_insecure_skip_verify\nprobe_insecure_skip_verify\n}", ExpectedErr: "latency_bucket: probe_insecure_skip_verify given twice"},
		{Input: "latency_bucket {\nsticky on\nsticky off\n}", ExpectedErr: "latency_bucket: sticky given twice"},
		{Input: "latency_bucket {\nsticky_user {a}\nsticky_user {b}\n}", ExpectedErr: "latency_bucket: sticky_user given twice"},
		{Input: "latency_bucket {\nsegment 10.0.0.1:443 5ms\nsegment 10.0.0.2:443 5ms\nsegment 10.0.0.1:443 9ms\n}",
			ExpectedErr: "latency_bucket: segment 10.0.0.1:443 given twice (first at Testfile:2), at Testfile:4"},

		// The shared sticky store.
		{Input: "latency_bucket {\nsticky_store redis main\nsticky_store_timeout 80ms\n}",
			Expected: `{"sticky_store":{"redis":"main","timeout":80000000}}`},
		{Input: "latency_bucket {\nsticky_store_timeout 80ms\nsticky_store redis main\n}",
			Expected: `{"sticky_store":{"redis":"main","timeout":80000000}}`},
		{Input: "latency_bucket {\nsticky_store redis main\n}", Expected: `{"sticky_store":{"redis":"main"}}`},
		{Input: "latency_bucket {\nsticky_store etcd main\n}", ExpectedErr: `latency_bucket: sticky_store "etcd": want redis, at Testfile:2`},
		{Input: "latency_bucket {\nsticky_store redis\n}", ExpectedErr: "latency_bucket: sticky_store: want 2 arguments, got 1: redis, at Testfile:2"},
		{Input: "latency_bucket {\nsticky_store redis a\nsticky_store redis b\n}", ExpectedErr: "latency_bucket: sticky_store given twice (first at Testfile:2), at Testfile:3"},
		{Input: "latency_bucket {\nsticky_store redis a\nsticky_store_timeout 0s\n}", ExpectedErr: `latency_bucket: sticky_store_timeout "0s": want a duration of at least 1ms, at Testfile:3`},
		{Input: "latency_bucket {\nsticky_store redis a\nsticky_store_timeout 50\n}", ExpectedErr: `latency_bucket: sticky_store_timeout "50"`},
		{Input: "latency_bucket {\nsticky_store_timeout 50ms\n}", ExpectedErr: "latency_bucket: sticky_store_timeout needs sticky_store redis <name>"},

		{Input: "latency_bucket {\nprobe_path /x\n}", ExpectedErr: `latency_bucket: unknown option "probe_path", at Testfile:2`},
		{Input: "latency_bucket {\nno_such_option 1\n}", ExpectedErr: `latency_bucket: unknown option "no_such_option", at Testfile:2`},
	}
	cfparsetest.Check(t, func() *Config { return new(Config) }, tests, func(c *Config) error { return c.Validate(false) })
}
