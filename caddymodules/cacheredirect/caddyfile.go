package cacheredirect

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

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
func (c *CacheRedirect) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	var t prmod.Transport
	transportSet := false
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt == "node" {
			if !d.NextArg() {
				return d.ArgErr()
			}
			c.Node, t.Node = d.Val(), d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			continue
		}
		if ok, err := t.UnmarshalOption(d); ok {
			if err != nil {
				return err
			}
			transportSet = true
			continue
		}
		if opt == "bypass_header" {
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.Errf("cache_redirect: bypass_header <name> [<value glob>]")
			}
			if c.BypassHeaders == nil {
				c.BypassHeaders = map[string]string{}
			}
			c.BypassHeaders[args[0]] = ""
			if len(args) == 2 {
				c.BypassHeaders[args[0]] = args[1]
			}
			continue
		}
		if opt == "client_ip_header" || opt == "cache_fail_duration" || opt == "cache_timeout" {
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur := &c.CacheFailDuration
			if opt == "cache_timeout" {
				dur = &c.CacheTimeout
			}
			if opt == "client_ip_header" {
				c.ClientIPHeader = d.Val()
			} else if err := dur.UnmarshalJSON([]byte(strconv.Quote(d.Val()))); err != nil {
				return d.Errf("cache_redirect: %s %q: %v", opt, d.Val(), err)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			continue
		}
		lists := map[string]*[]string{
			"caches": &c.Caches, "origin": &c.Origin, "trusted": &c.Trusted, "cache_peers": &c.CachePeers,
			"methods": &c.Methods, "bypass_path": &c.BypassPaths, "bypass_cookie": &c.BypassCookies,
		}
		dst, ok := lists[opt]
		if !ok {
			return d.Errf("cache_redirect: unknown option %q", opt)
		}
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		*dst = append(*dst, args...)
	}
	if transportSet {
		c.OriginTransport = &t
	}
	return nil
}
