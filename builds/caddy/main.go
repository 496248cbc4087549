// Command caddy is Caddy with its standard modules, every caddy-l4 module and
// every edgesteer module under caddymodules/. xcaddy.json lists the same
// plugins for an xcaddy build; a test keeps the two in step.
package main

import (
	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/edgesteer/edgesteer/internal/version"

	// Plugins: keep in step with xcaddy.json.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	_ "github.com/edgesteer/edgesteer/caddymodules/cacheredirect"
	_ "github.com/edgesteer/edgesteer/caddymodules/dashboard"
	_ "github.com/edgesteer/edgesteer/caddymodules/diameteragent"
	_ "github.com/edgesteer/edgesteer/caddymodules/diametermatch"
	_ "github.com/edgesteer/edgesteer/caddymodules/latencybucket"
	_ "github.com/edgesteer/edgesteer/caddymodules/ldapmatch"
	_ "github.com/edgesteer/edgesteer/caddymodules/ntier"
	_ "github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	_ "github.com/edgesteer/edgesteer/caddymodules/portrange"
	_ "github.com/edgesteer/edgesteer/caddymodules/redisstore"
	_ "github.com/edgesteer/edgesteer/caddymodules/tenantroute"
)

func main() {
	// `caddy version` prints "edgesteer <version> | caddy <caddy version>".
	caddy.CustomVersion = "edgesteer " + version.Version + " | caddy"
	caddycmd.Main()
}
