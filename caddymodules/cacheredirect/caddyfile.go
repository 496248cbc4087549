package cacheredirect

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	prmod "github.com/edgesteer/edgesteer/caddymodules/portrange"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("cache_redirect", parseCaddyfile)
	// A terminal handler, like reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("cache_redirect", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(CacheRedirect)
	return c, c.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile reads
//
//	cache_redirect {
//		caches <host:port...>
//		origin <host:port...>
//		client_ip_header <name>
//		trusted <cidr...>
//		cache_peers <cidr...>
//		methods <method...>
//		bypass_path <glob...>
//		bypass_cookie <name...>
//		bypass_header <name> [<value glob>]
//		cache_fail_duration <duration>
//		cache_timeout <duration>
//		node <name>
//		# source ports toward the origin (http.reverse_proxy.transport.port_range):
//		tier_map <file>
//		ports <lo-hi>
//		local_ip <ip>
//		usip
//		http { <Caddy http transport options> }
//	}
//
// The host and pattern options are lists: repeating them adds to the list.
// bypass_header is given once per header name, every other option once.
func (c *CacheRedirect) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "cache_redirect", 0, 0)
	if err != nil {
		return err
	}
	var t prmod.Transport
	transportSet := false
	lists := map[string]*[]string{
		"caches": &c.Caches, "origin": &c.Origin, "trusted": &c.Trusted, "cache_peers": &c.CachePeers,
		"methods": &c.Methods, "bypass_path": &c.BypassPaths, "bypass_cookie": &c.BypassCookies,
	}
	for o.Next() {
		if dst, ok := lists[o.Name()]; ok {
			var more []string
			more, err = o.List()
			*dst = append(*dst, more...)
		} else if o.Name() == "node" { // the handler's and the transport's
			c.Node, err = o.String()
			t.Node = c.Node
		} else if ok, terr := t.UnmarshalOption(o); ok {
			err, transportSet = terr, true
		} else {
			switch o.Name() {
			case "bypass_header":
				err = c.unmarshalBypassHeader(o)
			case "client_ip_header":
				c.ClientIPHeader, err = o.String()
			case "cache_fail_duration":
				c.CacheFailDuration, err = o.Duration(time.Nanosecond)
			case "cache_timeout":
				c.CacheTimeout, err = o.Duration(time.Nanosecond)
			default:
				err = o.Unknown()
			}
		}
		if err != nil {
			return err
		}
	}
	if transportSet {
		c.OriginTransport = &t
	}
	return nil
}

// unmarshalBypassHeader reads bypass_header <name> [<value glob>], once per
// header name (in any case, as HTTP compares them).
func (c *CacheRedirect) unmarshalBypassHeader(o *cfparse.Block) error {
	args, err := o.Args(1, 2)
	if err != nil {
		return err
	}
	if err := o.OnceFor(http.CanonicalHeaderKey(args[0])); err != nil {
		return err
	}
	if c.BypassHeaders == nil {
		c.BypassHeaders = map[string]string{}
	}
	c.BypassHeaders[args[0]] = ""
	if len(args) == 2 {
		c.BypassHeaders[args[0]] = args[1]
	}
	return nil
}
