package wrapped

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// abilities is a wrapped transport with every optional ability.
type abilities struct {
	tls, pp, cleaned bool
}

func (a *abilities) RoundTrip(*http.Request) (*http.Response, error) { return nil, nil }
func (a *abilities) TLSEnabled() bool                                { return a.tls }
func (a *abilities) EnableTLS(*reverseproxy.TLSConfig) error         { return nil }
func (a *abilities) ProxyProtocolEnabled() bool                      { return a.pp }
func (a *abilities) Cleanup() error                                  { a.cleaned = true; return nil }

// wrapper embeds Inner as the edgesteer transports do.
type wrapper struct{ Inner }

func TestAbilitiesPassThrough(t *testing.T) {
	for _, a := range []*abilities{{tls: true}, {pp: true}, {}} {
		var w any = &wrapper{Wrap(a, "latency_bucket")}
		tt, ok := w.(reverseproxy.TLSTransport)
		if !ok || tt.TLSEnabled() != a.tls {
			t.Fatalf("%+v: TLSEnabled not passed through (ok %v)", *a, ok)
		}
		pp, ok := w.(reverseproxy.ProxyProtocolTransport)
		if !ok || pp.ProxyProtocolEnabled() != a.pp {
			t.Fatalf("%+v: ProxyProtocolEnabled not passed through (ok %v)", *a, ok)
		}
		if err := tt.EnableTLS(nil); err == nil || !strings.Contains(err.Error(), "transport latency_bucket { transport http { tls } }") {
			t.Fatalf("EnableTLS: want a refusal naming the wrapped transport's block, got %v", err)
		}
		if err := w.(*wrapper).CleanupInner(); err != nil || !a.cleaned {
			t.Fatalf("CleanupInner: %v, cleaned %v", err, a.cleaned)
		}
	}
	// A wrapped transport without the abilities: off, and nothing to clean.
	w := wrapper{Wrap(http.DefaultTransport, "peer_rate_limit")}
	if w.TLSEnabled() || w.ProxyProtocolEnabled() || w.CleanupInner() != nil {
		t.Fatal("a plain RoundTripper reported TLS or PROXY protocol, or failed its cleanup")
	}
}
