package ogs

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

func TestParseFull(t *testing.T) {
	c := caddy.NewTestController("dns", `ogs vpn.example.test {
		gateway gw1 192.0.2.1:443
		gateway gw2 [2001:db8::2]:443 backup gw1
		probe tls
		probes 5
		deadline 3s
		probe_timeout 300ms
		answer_deadline 1s
		fallback_ttl 2
		cache_ttl 14d
		retry 30s
		ttl 60
		records 2
		unmeasured omit
		prefix 16 48
		location resolv_conf /etc/resolv.conf
		srv
		cache_file /tmp/x.json
		state blue
		recheck off
		soa ns1.example.test hostmaster.example.test 120
		ns ns1.example.test 192.0.2.53
		max_locations 10
		diagnostic why.vpn.example.test
		fallthrough example.test
	}`)
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	if len(cfg.Gateways) != 2 || cfg.Gateways[1].Backups[0] != "gw1" || cfg.Probes != 5 ||
		cfg.Deadline != 3*time.Second || cfg.CacheTTL != 14*24*time.Hour || cfg.Retry != 30*time.Second ||
		!cfg.OmitUnmeasured || cfg.MaxLocations != 10 || cfg.ProbeTimeout != 300*time.Millisecond || cfg.AnswerDeadline != time.Second || o.fallbackTTL != 2 {
		t.Fatalf("config %+v", cfg)
	}
	if o.names[0] != "vpn.example.test." || o.ttl != 60 || o.records != 2 || o.v4Prefix != 16 || o.v6Prefix != 48 ||
		!o.srv || o.cfg.CacheFile != "/tmp/x.json" || o.state != "blue" || o.diagnostic != "why.vpn.example.test." || o.resolv == nil {
		t.Fatalf("plugin %+v", o)
	}
	if cfg.Recheck >= 0 || o.soa.mname != "ns1.example.test." || o.soa.minimum != 120 || len(o.ns) != 1 || !o.ns[0].addrs[0].Equal(net.ParseIP("192.0.2.53")) {
		t.Fatalf("recheck, soa, ns: %v %+v %+v", cfg.Recheck, o.soa, o.ns)
	}
	if !o.Fall.Through("a.example.test.") {
		t.Fatal("fallthrough zones not set")
	}
}

func TestParseDefaults(t *testing.T) {
	c := caddy.NewTestController("dns", "ogs {\n gateway gw1 192.0.2.1:443\n}")
	c.ServerBlockKeys = []string{"vpn.example.test:53"}
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	if cfg.Probes != 3 || cfg.Deadline != 7*time.Second || cfg.CacheTTL != 14*24*time.Hour || cfg.Recheck != time.Minute || o.soa.minimum != 30 ||
		cfg.ProbeTimeout != 2*time.Second || cfg.AnswerDeadline != 1500*time.Millisecond || o.fallbackTTL != 5 {
		t.Fatalf("defaults: %+v", cfg)
	}
	c = caddy.NewTestController("dns", "ogs vpn.example.test {\n gateway gw1 192.0.2.1:443\n probe tcp\n}")
	if tcp, err := parse(c); err != nil || tcp.cfg.ProbeTimeout != 500*time.Millisecond {
		t.Fatalf("tcp probe timeout: %v %v", tcp.cfg.ProbeTimeout, err)
	}
	if o.names[0] != "vpn.example.test." || o.diagnostic != "_ogs.vpn.example.test." || o.ttl != 30 || o.state != "vpn.example.test:53" {
		t.Fatalf("%v %v %v %q", o.names, o.diagnostic, o.ttl, o.state)
	}
}

// TestSetupParse is the parse table, in CoreDNS's plugin setup test style:
// each input is a whole server block's ogs directive; a failing one must
// fail with the text given, which names the option and the value, and
// where a line matters, the file and line.
func TestSetupParse(t *testing.T) {
	const gw = "ogs vpn.example.test {\n gateway a 192.0.2.1:1\n" // option lines start at line 3
	tests := []struct {
		input     string
		shouldErr bool
		errText   string
	}{
		// valid
		{gw + "}", false, ""},
		{gw + "gateway b [2001:db8::2]:443 backup a\n gateway c 192.0.2.3:443\n}", false, ""},
		{gw + "ns ns1.vpn.example.test 192.0.2.53\n ns ns2.vpn.example.test\n}", false, ""},
		{gw + "cache_ttl 1d12h\n deadline 1.5s\n retry 0.5d\n}", false, ""},
		{gw + "ttl 2147483647\n fallback_ttl 0\n soa a.test b.test 2147483647\n}", false, ""},
		{gw + "prefix 0 128\n probes +3\n fallthrough\n}", false, ""},

		// numbers: decimal digits only, in range
		{gw + "probes 3x\n}", true, "Testfile:3 - Error during parsing: ogs: probes 3x: want a whole number of at least 1"},
		{gw + "probes 0x10\n}", true, "probes 0x10: want a whole number"},
		{gw + "probes 1_000\n}", true, "probes 1_000: want a whole number"},
		{gw + "probes 0\n}", true, "probes 0: want a whole number of at least 1"},
		{gw + "records 2.0\n}", true, "records 2.0: want a whole number"},
		{gw + "max_locations 0\n}", true, "max_locations 0: want a whole number of at least 1"},
		{gw + "ttl 4294967296\n}", true, "ttl 4294967296: want a whole number from 1 to 2147483647"},
		{gw + "ttl 2147483648\n}", true, "ttl 2147483648: want a whole number from 1 to 2147483647"},
		{gw + "fallback_ttl -5\n}", true, "fallback_ttl -5: want a whole number from 0 to 2147483647"},
		{gw + "fallback_ttl 5s\n}", true, "fallback_ttl 5s: want a whole number"},
		{gw + "prefix 33 56\n}", true, "prefix 33 56: V4LEN: want a whole number from 0 to 32"},
		{gw + "prefix 24 0x38\n}", true, "prefix 24 0x38: V6LEN: want a whole number from 0 to 128"},
		{gw + "soa a.test b.test 1e3\n}", true, "soa a.test b.test 1e3: MINIMUM: want a whole number"},
		{gw + "soa a.test b.test 4294967295\n}", true, "MINIMUM: want a whole number from 0 to 2147483647"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:0x1bb\n}", true, "Testfile:2 - Error during parsing: ogs: gateway a 192.0.2.1:0x1bb: bad port"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:99999\n}", true, "bad port \"99999\": want a whole number from 1 to 65535"},

		// durations: positive, with a unit
		{gw + "deadline 7\n}", true, "deadline 7: want a positive duration"},
		{gw + "cache_ttl 0x10d\n}", true, "cache_ttl 0x10d: want a positive duration"},
		{gw + "cache_ttl -1d\n}", true, "cache_ttl -1d: want a positive duration"},
		{gw + "probe_timeout 0s\n}", true, "probe_timeout 0s: want a positive duration"},
		{gw + "answer_deadline soon\n}", true, "answer_deadline soon: want a positive duration"},
		{gw + "retry 1.5\n}", true, "retry 1.5: want a positive duration"},
		{gw + "recheck soon\n}", true, "recheck soon: want a positive duration"},
		{gw + "hold -1h\n}", true, "hold -1h: want a positive duration"},

		// words
		{gw + "unmeasured sometimes\n}", true, "unmeasured sometimes: want last or omit"},
		{gw + "probe ping\n}", true, `probe ping: unknown probe kind "ping"`},
		{gw + "location geoip\n}", true, "location geoip: want location resolv_conf [PATH]"},
		{gw + "ns a.test 1.2.3\n}", true, `"1.2.3" is not an IP`},
		{gw + "colour blue\n}", true, `Testfile:3 - Error during parsing: ogs: unknown option "colour"`},

		// argument counts: extra or missing arguments fail, quoting the syntax
		{gw + "probes 3 4\n}", true, "Testfile:3 - Error during parsing: ogs: probes 3 4: want probes COUNT"},
		{gw + "probes\n}", true, "ogs: probes: want probes COUNT"},
		{gw + "ttl 30 60\n}", true, "ttl 30 60: want ttl SECONDS"},
		{gw + "cache_ttl 14 d\n}", true, "cache_ttl 14 d: want cache_ttl DURATION"},
		{gw + "recheck 1m 2m\n}", true, "recheck 1m 2m: want recheck DURATION|off"},
		{gw + "srv yes\n}", true, "srv yes: want srv"},
		{gw + "probe_verify_tls true\n}", true, "probe_verify_tls true: want probe_verify_tls"},
		{gw + "unmeasured omit now\n}", true, "unmeasured omit now: want unmeasured last|omit"},
		{gw + "probe tcp / x\n}", true, "probe tcp / x: want probe tcp|tls|http|https [PATH]"},
		{gw + "prefix 24\n}", true, "prefix 24: want prefix V4LEN V6LEN"},
		{gw + "location resolv_conf /a /b\n}", true, "want location resolv_conf [PATH]"},
		{gw + "cache_file /a /b\n}", true, "cache_file /a /b: want cache_file PATH"},
		{gw + "state\n}", true, "ogs: state: want state NAME"},
		{gw + "state a b\n}", true, "state a b: want state NAME"},
		{gw + "diagnostic a b\n}", true, "diagnostic a b: want diagnostic NAME"},
		{gw + "soa a.test.\n}", true, "soa a.test.: want soa MNAME RNAME [MINIMUM]"},
		{gw + "soa a b 1 2\n}", true, "soa a b 1 2: want soa MNAME RNAME [MINIMUM]"},
		{gw + "ns\n}", true, "ogs: ns: want ns NAME [ADDRESS...]"},
		{"ogs vpn.example.test {\n gateway a\n}", true, "gateway a: want gateway NAME ADDRESS:PORT [backup NAME|NAME=ADDRESS:PORT...]"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 standby c\n}", true, "gateway a 192.0.2.1:1 standby c: want gateway"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup\n}", true, "gateway a 192.0.2.1:1 backup: want gateway"},
		{gw + "probes 3 {\n }\n}", true, "Testfile:3 - Error during parsing: ogs: probes 3: takes no block"},

		// repeats: a single-valued option given twice fails at the second,
		// naming the first
		{gw + "probes 3\n probes 4\n}", true, "Testfile:4 - Error during parsing: ogs: probes given twice (first at Testfile:3)"},
		{gw + "recheck off\n ttl 5\n recheck 1m\n}", true, "Testfile:5 - Error during parsing: ogs: recheck given twice (first at Testfile:3)"},
		{gw + "fallthrough\n fallthrough example.test\n}", true, "Testfile:4 - Error during parsing: ogs: fallthrough given twice (first at Testfile:3)"},

		// across options
		{"ogs vpn.example.test {\n probes 3\n}", true, "at least one gateway"},
		{gw + "gateway a 192.0.2.2:1\n}", true, "duplicate name"},
		{gw + "gateway b 192.0.2.1:1\n}", true, "duplicate address"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup c\n}", true, `backup "c"`},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup c=192.0.2.9:443 d=[2001:db8::9]:443\n}", false, ""},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup c=bk.example.test:443\n}", true, "the address bk.example.test:443 must be an IP"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup c=192.0.2.9\n}", true, "missing port"},
		{"ogs vpn.example.test {\n gateway a 192.0.2.1:1 backup b=192.0.2.9:1\n gateway b 192.0.2.2:1\n}", true, "backup b=192.0.2.9:1: the name of a gateway"},
		{gw + "}\nogs {\n gateway b 192.0.2.2:1\n}", true, "only one ogs block per server block"},
	}
	for i, test := range tests {
		c := caddy.NewTestController("dns", test.input)
		_, err := parse(c)
		if test.shouldErr && err == nil {
			t.Errorf("test %d: expected error, got none for input %q", i, test.input)
		}
		if !test.shouldErr && err != nil {
			t.Errorf("test %d: expected no error, got %v for input %q", i, err, test.input)
		}
		if test.shouldErr && err != nil && !strings.Contains(err.Error(), test.errText) {
			t.Errorf("test %d: expected error containing %q, got %q", i, test.errText, err)
		}
	}
}

// TestSetupOnce gives every option twice: those the README calls
// repeatable parse, every other fails naming the option and both lines.
// It needs a valid line for each option, so a new option without one
// fails here.
func TestSetupOnce(t *testing.T) {
	tokens := tokensFile(t)
	lines := map[string][2]string{ // option → two valid lines of it
		"gateway":            {"gateway b 192.0.2.2:1", "gateway c 192.0.2.3:1"},
		"probe":              {"probe tcp", "probe https /health"},
		"probe_verify_tls":   {"probe_verify_tls", "probe_verify_tls"},
		"probe_check_status": {"probe_check_status", "probe_check_status"},
		"probes":             {"probes 3", "probes 4"},
		"deadline":           {"deadline 7s", "deadline 8s"},
		"probe_timeout":      {"probe_timeout 1s", "probe_timeout 1s"},
		"answer_deadline":    {"answer_deadline 1s", "answer_deadline 2s"},
		"cache_ttl":          {"cache_ttl 14d", "cache_ttl 1d"},
		"retry":              {"retry 1m", "retry 2m"},
		"ttl":                {"ttl 30", "ttl 60"},
		"fallback_ttl":       {"fallback_ttl 5", "fallback_ttl 1"},
		"records":            {"records 1", "records 2"},
		"unmeasured":         {"unmeasured omit", "unmeasured last"},
		"prefix":             {"prefix 24 56", "prefix 16 48"},
		"location":           {"location resolv_conf", "location resolv_conf /etc/resolv.conf"},
		"srv":                {"srv", "srv"},
		"cache_file":         {"cache_file /tmp/a.json", "cache_file /tmp/b.json"},
		"state":              {"state a", "state b"},
		"recheck":            {"recheck off", "recheck 1m"},
		"hold":               {"hold 0", "hold 4h"},
		"soa":                {"soa a.test b.test", "soa c.test d.test 60"},
		"ns":                 {"ns ns1.vpn.example.test", "ns ns2.vpn.example.test 192.0.2.53"},
		"max_locations":      {"max_locations 10", "max_locations 20"},
		"diagnostic":         {"diagnostic a.test", "diagnostic b.test"},
		"fallthrough":        {"fallthrough", "fallthrough example.test"},
		"store":              {"store redis {\n address 127.0.0.1:6379\n }", "store redis {\n address 127.0.0.1:6380\n key_prefix x\n }"},
		"admin":              {"admin 127.0.0.1:9153", "admin :9154"},

		"report_tokens":           {"report_tokens " + tokens, "report_tokens " + tokens},
		"report_window":           {"report_window 4h", "report_window 1d"},
		"min_reporters":           {"min_reporters 3", "min_reporters 5"},
		"max_reporters":           {"max_reporters 64", "max_reporters 10"},
		"max_report_locations":    {"max_report_locations 10", "max_report_locations 20"},
		"report_rate":             {"report_rate 1", "report_rate 0.5 20"},
		"report_max_body":         {"report_max_body 16384", "report_max_body 1024"},
		"trusted_proxies":         {"trusted_proxies 10.0.0.0/8", "trusted_proxies 10.0.0.0/8 ::1/128"},
		"reports":                 {"reports 127.0.0.1:9155", "reports :9156"},
		"report_source_prefix":    {"report_source_prefix 32 64", "report_source_prefix 24 56"},
		"max_reporters_per_token": {"max_reporters_per_token 1", "max_reporters_per_token 8"},
	}
	repeatable := map[string]bool{"gateway": true, "ns": true} // as the README says
	for opt := range options {
		two, ok := lines[opt]
		if !ok {
			t.Errorf("%s: no sample lines", opt)
			continue
		}
		pre := reportPrereq(opt, tokens)
		in := "ogs vpn.example.test {\n gateway a 192.0.2.1:1\n " + pre + two[0] + "\n " + two[1] + "\n}"
		_, err := parse(caddy.NewTestController("dns", in))
		if repeatable[opt] {
			if err != nil {
				t.Errorf("%s is repeatable: %v", opt, err)
			}
			continue
		}
		line := 3 + strings.Count(pre+two[0], "\n")
		want := fmt.Sprintf("Testfile:%d - Error during parsing: ogs: %s given twice (first at Testfile:%d)", line+1, opt, 3+strings.Count(pre, "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s twice: got %v, want %q", opt, err, want)
		}
		// Each line alone is valid.
		for _, l := range two {
			if _, err := parse(caddy.NewTestController("dns", "ogs vpn.example.test {\n gateway a 192.0.2.1:1\n "+pre+l+"\n}")); err != nil {
				t.Errorf("%q: %v", l, err)
			}
		}
	}
	if len(lines) != len(options) {
		t.Errorf("%d sample options, %d options", len(lines), len(options))
	}
}

// reportPrereq is what a report option needs before it, the endpoint:
// given before the lines tested.
func reportPrereq(opt, tokens string) string {
	switch {
	case opt == "report_tokens":
		return "admin 127.0.0.1:9153\n "
	case slices.Contains(reportOptions, opt):
		return "admin 127.0.0.1:9153\n report_tokens " + tokens + "\n "
	}
	return ""
}

// TestReadmeExamplesParse keeps the README's Corefile examples valid: the
// ogs block of each parses.
func TestReadmeExamplesParse(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, part := range strings.Split(string(readme), "~~~ corefile\n")[1:] {
		block := part[:strings.Index(part, "~~~")]
		start := strings.Index(block, "ogs ")
		if start < 0 {
			continue
		}
		depth, end := 0, start
		for i := start; i < len(block); i++ {
			if block[i] == '{' {
				depth++
			} else if block[i] == '}' {
				if depth--; depth == 0 {
					end = i + 1
					break
				}
			}
		}
		n++
		c := caddy.NewTestController("dns", block[start:end])
		c.ServerBlockKeys = []string{"vpn.example.test:53"}
		if _, err := parse(c); err != nil {
			t.Errorf("README example %d: %v\n%s", n, err, block[start:end])
		}
	}
	if n == 0 {
		t.Fatal("no ogs example found in README.md")
	}
}

// store redis reads its block through redisconn (the spelling of the Caddy
// app edgesteer_redis); the Redis key namespace is the served names unless
// state is given, so replicas on other ports share entries.
func TestParseStoreRedis(t *testing.T) {
	c := caddy.NewTestController("dns", `ogs vpn.example.test other.example.test {
		gateway gw1 192.0.2.1:443
		store redis {
			address 127.0.0.1:6379 127.0.0.1:6380
			key_prefix es
			read_timeout 100ms
			write_timeout 150ms
		}
		admin 127.0.0.1:9300
	}`)
	c.ServerBlockKeys = []string{"vpn.example.test:1053"}
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	if o.redis == nil || len(o.redis.Addresses) != 2 || o.redis.KeyPrefix != "es" || o.cfg.Store == nil || o.cfg.StoreTimeout != 150*time.Millisecond {
		t.Fatalf("redis %+v store %v timeout %v", o.redis, o.cfg.Store, o.cfg.StoreTimeout)
	}
	if o.store.ns != "es:ogs:vpn.example.test.,other.example.test.:" || o.admin != "127.0.0.1:9300" {
		t.Fatalf("namespace %q admin %q", o.store.ns, o.admin)
	}
	c = caddy.NewTestController("dns", "ogs vpn.example.test {\n gateway gw1 192.0.2.1:443\n state blue\n store redis {\n address r:6379\n }\n}")
	if o, err := parse(c); err != nil || o.store.ns != "edgesteer:ogs:blue:" {
		t.Fatalf("with state: %v %q", err, o.store.ns)
	}
}

func TestParseStoreAndAdminErrors(t *testing.T) {
	for body, want := range map[string]string{
		"store file":                         `store file: unknown store "file"`,
		"store redis":                        "store redis: address: at least one Redis address is required",
		"store redis {\n address nohost\n }": `store redis: address "nohost": want host:port`,
		"store redis {\n address h:1\n colour blue\n }":              `store redis: unknown option "colour"`,
		"store redis {\n address h:1\n db x\n }":                     "store redis: db x: want a whole number",
		"store redis {\n address h:1\n db 1\n db 2\n }":              "store redis: db given twice",
		"store redis {\n address h:1\n tls_ca_file /nonexistent\n }": "tls_ca_file",
		"admin nohost":      "admin nohost: want HOST:PORT",
		"admin 127.0.0.1:0": `admin 127.0.0.1:0: bad port "0"`,
		"admin 127.0.0.1:x": `bad port "x"`,
		"admin a/b:80":      `bad host "a/b"`,
		"admin 1 2":         "want admin HOST:PORT",
	} {
		_, err := parse(caddy.NewTestController("dns", "ogs vpn.example.test {\n gateway a 192.0.2.1:1\n "+body+"\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", body, err, want)
		}
	}
}
