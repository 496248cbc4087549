package diameteragent

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

func TestBindingStoreCaddyfile(t *testing.T) {
	head := `{"origin_host":"dra","origin_realm":"r","host_ip_addresses":["127.0.0.1"],"applications":[{"id":4}],`
	cases := []cfparsetest.Case{
		{Input: minimal + "binding_store redis main\n}", Expected: head + `"binding_store":{"redis":"main"}}`},
		{Input: minimal + "binding_store redis main {\ntimeout 20ms\nbacklog 5000\n}\n}",
			Expected: head + `"binding_store":{"redis":"main","timeout":20000000,"backlog":5000}}`},
		{Input: minimal + "binding_store etcd main\n}", ExpectedErr: `diameter_agent: binding_store "etcd": want redis <name>`},
		{Input: minimal + "binding_store redis\n}", ExpectedErr: "diameter_agent: binding_store: want 2 arguments, got 1: redis"},
		{Input: minimal + "binding_store redis a\nbinding_store redis b\n}", ExpectedErr: "diameter_agent: binding_store given twice"},
		{Input: minimal + "binding_store redis a {\nbacklog 0\n}\n}", ExpectedErr: `diameter_agent: binding_store: backlog "0"`},
		{Input: minimal + "binding_store redis a {\nttl 1s\n}\n}", ExpectedErr: `diameter_agent: binding_store: unknown option "ttl"`},
	}
	cfparsetest.Check(t, func() *Handler { return new(Handler) }, cases, nil)
}

// Bad binding_store values fail at load naming the option and value; a
// store that edgesteer_redis does not declare is named.
func TestBindingStoreProvisionErrors(t *testing.T) {
	for _, c := range []struct {
		bs  BindingStoreConfig
		err string
	}{
		{BindingStoreConfig{Redis: "main", Timeout: caddy.Duration(2 * time.Second)}, "diameter_agent t-store: binding_store timeout 2s: want 1ms to 1s"},
		{BindingStoreConfig{Redis: "main", Backlog: -1}, "binding_store backlog -1: must be positive"},
		{BindingStoreConfig{}, `binding_store redis "": name a store`},
		{BindingStoreConfig{Redis: "main"}, `diameter_agent t-store: binding_store: no Redis store named "main"`},
	} {
		bs := c.bs
		h := &Handler{Name: "t-store", OriginHost: "dra", OriginRealm: "r", HostIPAddresses: []string{"127.0.0.1"},
			Applications: []diameteragent.Application{{ID: 4}}, BindingStore: &bs}
		err := h.Provision(newConfig(t).ctx)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%+v: want an error containing %q, got %v", c.bs, c.err, err)
		}
		if err == nil {
			h.Cleanup()
		}
	}
}

// A report's field and value read from Redis are network input: only a
// known type, a sequence, a reduction up to 100 and an expiry after Redis'
// now make a report; its validity left is by Redis' clock.
func TestParseSharedReport(t *testing.T) {
	const now = 1_800_000_000_000
	e, ok := parseReport("0:pcrf1.example", "7 50 1800000010000", now)
	if !ok || e.Name != "pcrf1.example" || e.Seq != 7 || e.Reduction != 50 || e.Remaining != 10*time.Second {
		t.Fatalf("a report: %+v %v", e, ok)
	}
	for _, c := range [][2]string{
		{"3:pcrf1.example", "7 50 1800000010000"},  // no such type
		{"0:pcrf1.example", "7 101 1800000010000"}, // over 100 %
		{"0:pcrf1.example", "7 50 1800000000000"},  // expired
		{"0:pcrf1.example", "7 50 1890000000000"},  // over 24 h left
		{"0:pcrf 1", "7 50 1800000010000"},         // not a word
		{"pcrf1.example", "7 50 1800000010000"},    // no type
		{"0:pcrf1.example", "x 50 1800000010000"},
		{"0:pcrf1.example", "7 50"},
	} {
		if e, ok := parseReport(c[0], c[1], now); ok {
			t.Errorf("%q %q read as %+v", c[0], c[1], e)
		}
	}
}
