package diameteragent

import (
	"strings"
	"testing"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// A reload keeps the connections up and down and the bindings, and its
// routes and limits apply from the next request. A peer whose address
// changed is connected anew; a removed one is disconnected with a DPR.
func TestUpdateKeepsConnectionsAndBindings(t *testing.T) {
	h := newHarness(t, baseConfig())
	h.start()
	c := h.connect("pgw1.example")
	first := c.call(req{app: diameter.AppGx, ccType: 1, session: "keep", e2e: 1}.bytes(t)).origin
	links := map[string]*link{}
	for host := range h.srv {
		links[host] = h.peer(host).link.Load()
	}
	cfg := baseConfig()
	cfg.Peers = cfg.Peers[:3] // ocs2 removed
	cfg.Groups[1].Peers = cfg.Groups[1].Peers[:1]
	cfg.Routes = append(cfg.Routes, Route{Realm: "other.example", Group: "ocs"})
	cfg.Groups[0].Egress = ratelimit.NewProfile("pcrf", rule(t, "overall", 1), nil, 4) // burst 2
	if err := h.agent.Update(cfg); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"pcrf1.example", "pcrf2.example", "ocs1.example"} {
		s := h.srv[host]
		s.mu.Lock()
		conns := s.conns
		s.mu.Unlock()
		if h.peer(host).link.Load() != links[host] || conns != 1 {
			t.Errorf("%s: connection replaced by the reload", host)
		}
	}
	eventually(t, "DPR to the removed peer", func() bool { return h.srv["ocs2.example"].count(cmdDPR, true) == 1 })
	if a := c.call(req{app: diameter.AppGy, realm: "other.example", e2e: 2}.bytes(t)); a.result != ResultSuccess || a.origin != "ocs1.example" {
		t.Fatalf("new route: %d from %s", a.result, a.origin)
	}
	for i := range 5 {
		if got := c.call(req{app: diameter.AppGx, ccType: 2, session: "keep", e2e: uint32(10 + i)}.bytes(t)); got.result == ResultSuccess && got.origin != first {
			t.Fatalf("binding lost: CCR-U at %s, CCR-I at %s", got.origin, first)
		}
	}
	if v := h.agent.View(); v.Groups[0].Refused != 3 || !strings.Contains(v.Peers[0].State, "OKAY") || v.Bindings != 1 {
		t.Fatalf("view after reload: %+v", v)
	}
	if err := h.agent.Update(Config{Identity: Identity{OriginHost: "x"}}); err == nil || !strings.Contains(err.Error(), "origin_realm") {
		t.Fatalf("bad config: %v", err)
	}
}

// Bad configuration is refused naming the option and the value.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Watchdog = 2e9 }, "watchdog 2s"},
		{func(c *Config) { c.Groups[0].Policy = "random" }, `policy "random"`},
		{func(c *Config) { c.Groups[0].Peers = []string{"nobody"} }, `peer "nobody"`},
		{func(c *Config) { c.Routes[0].Group = "none" }, `group "none"`},
		{func(c *Config) { c.Peers[0].Address = "pcrf1" }, `address "pcrf1"`},
		{func(c *Config) { c.Groups[0].Refusal.ResultCode = 42 }, "result_code 42"},
		{func(c *Config) { c.DefaultGroup = "x" }, `default_group "x"`},
		{func(c *Config) { c.Applications = nil }, "applications"},
		{func(c *Config) { c.Peers[0].Applications = []uint32{5} }, "peer pcrf1.example: application 5: not among the agent's applications"},
		{func(c *Config) { c.Routes[0].Applications = []uint32{5} }, "route pcrf.example pcrf: application 5: not among the agent's applications"},
		{func(c *Config) { c.Peers[1].Applications = []uint32{diameter.AppGy} },
			"route pcrf.example pcrf: application 16777238: peer pcrf2.example of the group does not list it"},
	} {
		cfg := baseConfig()
		tc.edit(&cfg)
		if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}
