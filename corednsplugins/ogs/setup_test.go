package ogs

import (
	"net"
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
		t.Fatalf("seed defaults: %+v", cfg)
	}
	c = caddy.NewTestController("dns", "ogs vpn.example.test {\n gateway gw1 192.0.2.1:443\n probe tcp\n}")
	if tcp, err := parse(c); err != nil || tcp.cfg.ProbeTimeout != 500*time.Millisecond {
		t.Fatalf("tcp probe timeout: %v %v", tcp.cfg.ProbeTimeout, err)
	}
	if o.names[0] != "vpn.example.test." || o.diagnostic != "_ogs.vpn.example.test." || o.ttl != 30 || o.state != "vpn.example.test:53" {
		t.Fatalf("%v %v %v %q", o.names, o.diagnostic, o.ttl, o.state)
	}
}

func TestParseErrorsNameOption(t *testing.T) {
	for body, want := range map[string]string{
		"gateway a 192.0.2.1:1\nprobes 0":              "probes 0",
		"gateway a 192.0.2.1:1\ndeadline 7":            "deadline 7",
		"gateway a 192.0.2.1:1\ncache_ttl -1d":         "cache_ttl -1d",
		"gateway a 192.0.2.1:1\nprobe_timeout 0s":      "probe_timeout 0s",
		"gateway a 192.0.2.1:1\nanswer_deadline soon":  "answer_deadline soon",
		"gateway a 192.0.2.1:1\nfallback_ttl -5":       "fallback_ttl -5",
		"gateway a 192.0.2.1:1\ngateway a 192.0.2.2:1": "duplicate name",
		"gateway a 192.0.2.1:1\ngateway b 192.0.2.1:1": "duplicate address",
		"gateway a 192.0.2.1:1 backup c":               `backup "c"`,
		"gateway a 192.0.2.1:1 standby c":              "gateway a 192.0.2.1:1 standby c",
		"gateway a 192.0.2.1:99999":                    "bad port",
		"gateway a 192.0.2.1:1\nunmeasured sometimes":  "want last or omit",
		"gateway a 192.0.2.1:1\nprefix 33 56":          "prefix 33 56",
		"gateway a 192.0.2.1:1\nlocation geoip":        "location geoip",
		"gateway a 192.0.2.1:1\ncolour blue":           `unknown option "colour"`,
		"probes 3":                                     "at least one gateway",
		"gateway a 192.0.2.1:1\nstate":                 "state : want one name",
		"gateway a 192.0.2.1:1\nrecheck soon":          "recheck soon",
		"gateway a 192.0.2.1:1\nsoa a.test.":           "soa a.test.: want soa MNAME RNAME",
		"gateway a 192.0.2.1:1\nsoa a b many":          "MINIMUM",
		"gateway a 192.0.2.1:1\nns":                    "want ns NAME",
		"gateway a 192.0.2.1:1\nns a.test 1.2.3":       `"1.2.3" is not an IP`,
	} {
		c := caddy.NewTestController("dns", "ogs vpn.example.test {\n"+body+"\n}")
		_, err := parse(c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", body, err, want)
		}
	}
}
