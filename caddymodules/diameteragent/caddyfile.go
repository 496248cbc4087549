package diameteragent

import (
	"math"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

const module = "diameter_agent"

// UnmarshalCaddyfile reads
//
//	diameter_agent [<name>] {
//		origin_host <identity>
//		origin_realm <realm>
//		host_ip_address <ip...>
//		vendor_id <id>
//		product_name <text>
//		application <id> [vendor <id>] [acct]     # repeatable
//		peer <host> {                             # repeatable
//			realm <realm>
//			address <host:port>
//			applications <id...>                  # its CER's; default all of the agent's
//		}
//		group <name> {                            # repeatable
//			peers <host...>
//			policy round_robin|least_outstanding|latency_bucket|least_loaded
//			bucket_width <duration>               # latency_bucket's, default 32ms
//			request_timeout <duration>
//			max_pending <n>
//			max_pending_per_peer <n>
//			egress { <limit> }
//			dynamic { <peer_rate_limit's dynamic block> }
//		}
//		route <realm|*> <group> [<application id>...]   # repeatable, first match wins
//		default_group <group>
//		ingress { <limit> }
//		doic { <doic options, doic.go> }
//		watchdog <duration>
//		reconnect <min> <max>
//		max_bindings <n>
//		binding_ttl <duration>
//		server_request_timeout <duration>
//		max_length <bytes>
//	}
//
// where <limit> is
//
//	rate <per second> [<burst>]
//	message <type> <per second> [<burst>]     # repeatable, once per type
//	max_peers <n>
//	action reject|drop
//	result_code <code>
//	error_message <text>
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	args, b, err := cfparse.Open(d, module, 0, 1)
	if err != nil {
		return err
	}
	if len(args) == 1 {
		h.Name = args[0]
	}
	for b.Next() {
		if err := h.option(b); err != nil {
			return err
		}
	}
	return nil
}

func (h *Handler) option(b *cfparse.Block) error {
	var err error
	switch b.Name() {
	case "name":
		if h.Name != "" {
			return b.Errf("already named %q", h.Name)
		}
		h.Name, err = b.String()
	case "origin_host":
		h.OriginHost, err = b.String()
	case "origin_realm":
		h.OriginRealm, err = b.String()
	case "host_ip_address":
		var ips []string
		ips, err = b.List()
		h.HostIPAddresses = append(h.HostIPAddresses, ips...)
	case "vendor_id":
		h.VendorID, err = uint32Opt(b)
	case "product_name":
		h.ProductName, err = b.String()
	case "application":
		err = h.application(b)
	case "peer":
		err = h.peer(b)
	case "group":
		err = h.group(b)
	case "route":
		err = h.route(b)
	case "default_group":
		h.DefaultGroup, err = b.String()
	case "ingress":
		if err = b.Once(); err == nil {
			h.Ingress, err = limit(b)
		}
	case "doic":
		h.DOIC, err = unmarshalDOIC(b)
	case "watchdog":
		h.Watchdog, err = b.Duration(time.Second)
	case "reconnect":
		err = h.reconnect(b)
	case "max_bindings":
		h.MaxBindings, err = b.Int(1, math.MaxInt32)
	case "binding_ttl":
		h.BindingTTL, err = b.Duration(time.Second)
	case "server_request_timeout":
		h.ServerRequestTimeout, err = b.Duration(time.Millisecond)
	case "max_length":
		h.MaxLength, err = b.Int(20, 1<<24)
	case "binding_store":
		err = h.bindingStore(b)
	default:
		return b.Unknown()
	}
	return err
}

func uint32Opt(b *cfparse.Block) (uint32, error) {
	n, err := b.Int(0, math.MaxUint32)
	return uint32(n), err
}

func (h *Handler) application(b *cfparse.Block) error {
	args, err := b.Args(1, 4)
	if err != nil {
		return err
	}
	id, err := b.ParseInt(args[0], 0, math.MaxUint32)
	if err != nil {
		return err
	}
	app := diameteragent.Application{ID: uint32(id)}
	for i := 1; i < len(args); i++ {
		switch {
		case args[i] == "acct":
			app.Acct = true
		case args[i] == "vendor" && i+1 < len(args):
			v, err := b.ParseInt(args[i+1], 1, math.MaxUint32)
			if err != nil {
				return err
			}
			app.VendorID = uint32(v)
			i++
		default:
			return b.Invalid(args[i], errWant("vendor <id> or acct"))
		}
	}
	h.Applications = append(h.Applications, app)
	return nil
}

func (h *Handler) peer(b *cfparse.Block) error {
	args, err := b.BlockArgs(1, 1)
	if err != nil {
		return err
	}
	if err := b.OnceFor(args[0]); err != nil {
		return err
	}
	p := PeerConfig{Host: args[0]}
	sub := b.Sub()
	for sub.Next() {
		switch sub.Name() {
		case "realm":
			p.Realm, err = sub.String()
		case "address":
			p.Address, err = sub.String()
		case "applications":
			var ids []string
			if err = sub.Once(); err == nil {
				if ids, err = sub.List(); err == nil {
					p.Applications, err = applicationIDs(sub, ids)
				}
			}
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return err
		}
	}
	h.Peers = append(h.Peers, p)
	return nil
}

func (h *Handler) group(b *cfparse.Block) error {
	args, err := b.BlockArgs(1, 1)
	if err != nil {
		return err
	}
	if err := b.OnceFor(args[0]); err != nil {
		return err
	}
	g := GroupConfig{Name: args[0]}
	sub := b.Sub()
	for sub.Next() {
		switch sub.Name() {
		case "peers":
			var ps []string
			ps, err = sub.List()
			g.Peers = append(g.Peers, ps...)
		case "policy":
			g.Policy, err = sub.String()
		case "bucket_width":
			g.BucketWidth, err = sub.Duration(time.Microsecond)
		case "request_timeout":
			g.RequestTimeout, err = sub.Duration(time.Millisecond)
		case "max_pending":
			g.MaxPending, err = sub.Int(1, math.MaxInt32)
		case "max_pending_per_peer":
			g.MaxPendingPerPeer, err = sub.Int(1, math.MaxInt32)
		case "egress":
			if err = sub.Once(); err == nil {
				g.Egress, err = limit(sub)
			}
		case "dynamic":
			g.Dynamic, err = peerratelimit.UnmarshalDynamic(sub)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return err
		}
	}
	h.Groups = append(h.Groups, g)
	return nil
}

func (h *Handler) route(b *cfparse.Block) error {
	args, err := b.Args(2, cfparse.Many)
	if err != nil {
		return err
	}
	r := RouteConfig{Realm: args[0], Group: args[1]}
	if r.Applications, err = applicationIDs(b, args[2:]); err != nil {
		return err
	}
	h.Routes = append(h.Routes, r)
	return nil
}

// applicationIDs parses Application-Ids (decimal).
func applicationIDs(b *cfparse.Block, args []string) ([]uint32, error) {
	var ids []uint32
	for _, s := range args {
		id, err := b.ParseInt(s, 0, math.MaxUint32)
		if err != nil {
			return nil, err
		}
		ids = append(ids, uint32(id))
	}
	return ids, nil
}

func (h *Handler) reconnect(b *cfparse.Block) error {
	if err := b.Once(); err != nil {
		return err
	}
	args, err := b.Args(2, 2)
	if err != nil {
		return err
	}
	if h.ReconnectMin, err = b.ParseDuration(args[0], time.Millisecond); err != nil {
		return err
	}
	h.ReconnectMax, err = b.ParseDuration(args[1], time.Millisecond)
	return err
}

// limit reads an ingress or egress block.
func limit(b *cfparse.Block) (*LimitConfig, error) {
	if _, err := b.BlockArgs(0, 0); err != nil {
		return nil, err
	}
	l := &LimitConfig{}
	sub := b.Sub()
	for sub.Next() {
		var err error
		switch sub.Name() {
		case "rate":
			err = rateArgs(sub, &l.Rate, &l.Burst)
		case "message":
			var m MessageConfig
			args, e := sub.Args(2, 3)
			if e != nil {
				return nil, e
			}
			if err = sub.OnceFor(args[0]); err == nil {
				m.Type = args[0]
				err = parseRate(sub, args[1:], &m.Rate, &m.Burst)
				l.Messages = append(l.Messages, m)
			}
		case "max_peers":
			l.MaxPeers, err = sub.Int(1, math.MaxInt32)
		default:
			err = refusalOption(sub, &l.Action, &l.ResultCode, &l.ErrorMessage)
		}
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

// refusalOption reads the options of a refusal (in a limit block and in
// doic): action, result_code, error_message; any other is unknown.
func refusalOption(sub *cfparse.Block, action *string, code *uint32, msg *string) error {
	var err error
	switch sub.Name() {
	case "action":
		*action, err = sub.String()
		if err == nil && *action != "reject" && *action != "drop" {
			err = sub.Invalid(*action, errWant("reject or drop"))
		}
	case "result_code":
		var n int
		n, err = sub.Int(1000, 5999)
		*code = uint32(n)
	case "error_message":
		*msg, err = sub.String()
	default:
		err = sub.Unknown()
	}
	return err
}

// rateArgs reads "rate <per second> [<burst>]", given once.
func rateArgs(b *cfparse.Block, rate *float64, burst *int) error {
	if err := b.Once(); err != nil {
		return err
	}
	args, err := b.Args(1, 2)
	if err != nil {
		return err
	}
	return parseRate(b, args, rate, burst)
}

func parseRate(b *cfparse.Block, args []string, rate *float64, burst *int) error {
	var err error
	if *rate, err = b.ParseFloat(args[0], math.SmallestNonzeroFloat64, math.MaxFloat64); err != nil {
		return err
	}
	if len(args) == 2 {
		*burst, err = b.ParseInt(args[1], 1, math.MaxInt32)
	}
	return err
}

type errWant string

func (e errWant) Error() string { return "want " + string(e) }

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
