package cacheredirect

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/internal/cacheroute"
)

// The lower tier's whole per-request decision (cacheability with the
// example's rules, the client address from a trusted peer) against the
// anchor: what a plain Caddy config would spend to route bypasses by path
// and cookie with its own matchers (path + header regexp), on the same
// request, in the same run.
func BenchmarkDecision(b *testing.B) {
	r := httptest.NewRequest("GET", "/img/logo.png", nil)
	r.Header.Set("Cookie", "theme=dark")
	r.Header.Set("Client-IP", "10.77.0.10")
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))

	b.Run("cache_redirect", func(b *testing.B) {
		trusted, _ := cacheroute.ParsePrefixes([]string{"10.77.0.5"})
		rt := cacheroute.Router{
			Policy: cacheroute.Policy{
				BypassPaths:   []string{"/api/*"},
				BypassCookies: []string{"session"},
				BypassHeaders: map[string]string{"Cache-Control": "*no-cache*"},
			},
			CachePeers: trusted,
		}
		if err := rt.Policy.Validate(); err != nil {
			b.Fatal(err)
		}
		c := cacheroute.NewClientIP("Client-IP", trusted)
		peer, client := netip.MustParseAddr("10.77.0.5"), netip.MustParseAddr("10.77.0.9")
		up := func() bool { return true }
		b.ReportAllocs()
		for b.Loop() {
			if a, _, _ := c.Resolve(peer, r.Header); !a.IsValid() {
				b.Fatal("no client")
			}
			if path, _ := rt.Route(r, client, up); path != cacheroute.PathCache {
				b.Fatal(path)
			}
		}
	})
	b.Run("anchor_caddy_matchers", func(b *testing.B) {
		path := caddyhttp.MatchPath{"/api/*"}
		cookie := caddyhttp.MatchHeaderRE{"Cookie": &caddyhttp.MatchRegexp{Pattern: `(^|;\s*)session=`}}
		ctx := caddy.Context{Context: context.Background()}
		if err := path.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		if err := cookie.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			p, _ := path.MatchWithError(r)
			c, _ := cookie.MatchWithError(r)
			if p || c {
				b.Fatal("matched")
			}
		}
	})
}
