package cacheroute

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestCacheable(t *testing.T) {
	p := Policy{
		BypassPaths:   []string{"/api/*", "*.php"},
		BypassCookies: []string{"session"},
		BypassHeaders: map[string]string{"Cache-Control": "*no-cache*", "X-Debug": ""},
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, target string
		header               http.Header
		want                 bool
		reason               string
	}{
		{"plain GET", "GET", "/img/logo.png", nil, true, ""},
		{"HEAD", "HEAD", "/img/logo.png", nil, true, ""},
		{"POST bypasses", "POST", "/img/logo.png", nil, false, "method POST"},
		{"credentials", "GET", "/a", http.Header{"Authorization": {"Basic x"}}, false, "authorization"},
		{"websocket", "GET", "/ws", http.Header{"Upgrade": {"websocket"}}, false, "upgrade"},
		{"path glob", "GET", "/api/users", nil, false, "path /api/*"},
		{"path prefix across slashes", "GET", "/api/users/7", nil, false, "path /api/*"},
		{"suffix glob", "GET", "/index.php", nil, false, "path *.php"},
		{"cookie", "GET", "/a", http.Header{"Cookie": {"theme=dark; session=1"}}, false, "cookie session"},
		{"other cookie", "GET", "/a", http.Header{"Cookie": {"theme=dark"}}, true, ""},
		{"cookie prefix only", "GET", "/a", http.Header{"Cookie": {"sessionid=1; xsession=2"}}, true, ""},
		{"second Cookie line", "GET", "/a", http.Header{"Cookie": {"a=1", "b=2;session=x"}}, false, "cookie session"},
		{"header value", "GET", "/a", http.Header{"Cache-Control": {"max-age=0, no-cache"}}, false, "header Cache-Control"},
		{"header other value", "GET", "/a", http.Header{"Cache-Control": {"max-age=60"}}, true, ""},
		{"header presence", "GET", "/a", http.Header{"X-Debug": {"1"}}, false, "header X-Debug"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.target, nil)
		for k, v := range c.header {
			r.Header[k] = v
		}
		ok, reason := p.Cacheable(r)
		if ok != c.want || reason != c.reason {
			t.Errorf("%s: got %v %q want %v %q", c.name, ok, reason, c.want, c.reason)
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, p := range []Policy{{BypassPaths: []string{"[a"}}, {BypassHeaders: map[string]string{"X": "[z"}}, {Methods: []string{"get"}}} {
		if err := p.Validate(); err == nil {
			t.Errorf("%+v: no error", p)
		}
	}
}

func TestClientIP(t *testing.T) {
	trusted, err := ParsePrefixes([]string{"10.77.0.5", "192.168.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClientIP("Client-IP", trusted)
	a := netip.MustParseAddr
	cases := []struct {
		name          string
		peer          string
		header        []string
		want          string
		fromH, forged bool
	}{
		{"no header", "10.77.0.10", nil, "10.77.0.10", false, false},
		{"forged by a client", "10.77.0.10", []string{"1.2.3.4"}, "10.77.0.10", false, true},
		{"from a trusted cache", "10.77.0.5", []string{"10.77.0.10"}, "10.77.0.10", true, false},
		{"trusted CIDR", "192.168.3.4", []string{"2001:db8::1"}, "2001:db8::1", true, false},
		{"trusted, garbage", "10.77.0.5", []string{"not-an-ip"}, "10.77.0.5", false, false},
		{"trusted, two copies", "10.77.0.5", []string{"1.1.1.1", "2.2.2.2"}, "10.77.0.5", false, false},
		{"mapped peer", "::ffff:10.77.0.5", []string{"10.77.0.11"}, "10.77.0.11", true, false},
	}
	for _, tc := range cases {
		h := http.Header{}
		for _, v := range tc.header {
			h.Add("Client-IP", v)
		}
		got, fromH, forged := c.Resolve(a(tc.peer), h)
		if got != a(tc.want) || fromH != tc.fromH || forged != tc.forged {
			t.Errorf("%s: got %v %v %v", tc.name, got, fromH, forged)
		}
	}
	if _, err := ParsePrefixes([]string{"10.0.0.0/33"}); err == nil {
		t.Error("bad CIDR accepted")
	}
}

// The three N-tier flows as paths: a cacheable request goes to the cache
// (or the origin if no cache is up), a non-cacheable one bypasses, and a
// cache's own request (its miss) goes to the origin whatever it is.
func TestRoute(t *testing.T) {
	peers, _ := ParsePrefixes([]string{"10.77.0.5"})
	rt := Router{Policy: Policy{BypassPaths: []string{"/api/*"}}, CachePeers: peers}
	if err := rt.Policy.Validate(); err != nil {
		t.Fatal(err)
	}
	up, down := func() bool { return true }, func() bool { return false }
	a := netip.MustParseAddr
	cases := []struct {
		name, method, target, peer string
		cacheUp                    func() bool
		path, reason               string
	}{
		{"hit or miss: to the cache", "GET", "/img/a.png", "10.77.0.10", up, PathCache, ""},
		{"no cache up", "GET", "/img/a.png", "10.77.0.10", down, PathFallback, "no cache available"},
		{"bypass", "GET", "/api/x", "10.77.0.10", up, PathBypass, "path /api/*"},
		{"POST bypass", "POST", "/img/a.png", "10.77.0.10", up, PathBypass, "method POST"},
		{"the cache's miss", "GET", "/img/a.png", "10.77.0.5", up, PathMiss, "from cache"},
		{"the cache's miss, mapped", "GET", "/img/a.png", "::ffff:10.77.0.5", up, PathMiss, "from cache"},
	}
	for _, c := range cases {
		path, reason := rt.Route(httptest.NewRequest(c.method, c.target, nil), a(c.peer), c.cacheUp)
		if path != c.path || reason != c.reason {
			t.Errorf("%s: got %s %q, want %s %q", c.name, path, reason, c.path, c.reason)
		}
	}
}
