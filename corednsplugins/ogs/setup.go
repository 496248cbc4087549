package ogs

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/ogs"
)

const pluginName = "ogs"

// exchangeProbeTimeout is the default probe_timeout of the tls, http and
// https probes.
const exchangeProbeTimeout = 2 * time.Second

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

// states holds each ogs block's process state (cached locations, probe runs
// in flight, background work) by its state name, so that a reload, which
// starts the new configuration before stopping the old, hands it over.
var states = ogs.NewPool()

// stateNames is the instance storage key of the state names (and cache
// files) in use by one configuration: two ogs blocks sharing one would fight
// over its settings (or overwrite each other's file).
type stateNames struct{}

func setup(c *caddy.Controller) error {
	o, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	used, _ := c.Get(stateNames{}).(map[string]bool)
	if used == nil {
		used = map[string]bool{}
		c.Set(stateNames{}, used)
	}
	if used["state:"+o.state] {
		return plugin.Error(pluginName, c.Errf("state %q: already used by another ogs block; give each its own", o.state))
	}
	used["state:"+o.state] = true
	if f := o.cfg.CacheFile; f != "" {
		if used["file:"+f] {
			return plugin.Error(pluginName, c.Errf("cache_file %s: already used by another ogs block; give each its own", f))
		}
		used["file:"+f] = true
	}

	// CoreDNS reload order: the old instance's OnRestart, the new instance's
	// setup and OnStartup, then the old instance's OnShutdown; when the new
	// instance fails after its OnStartup, the old one's OnRestartFailed.
	c.OnStartup(o.start)
	c.OnShutdown(o.stop)
	c.OnRestart(func() error {
		o.mark, o.marked = states.Mark(), true
		return nil
	})
	c.OnRestartFailed(o.restartFailed)
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		o.Next = next
		return o
	})
	return nil
}

// start takes this configuration's lease on its state: a new one (reading
// the cache file), or the previous configuration's, with this one's settings
// applied.
func (o *OGS) start() error {
	a, err := states.Acquire(o.state, o.cfg)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	o.lease, o.sel = a.Lease, a.Selector()
	switch {
	case a.Adopted:
		log.Infof("state %q adopted from the previous configuration: %s", o.state, a.Change)
	case a.LoadErr != nil:
		log.Warningf("cache file: %v (starting empty)", a.LoadErr)
	case a.Loaded > 0:
		log.Infof("loaded %d location(s) from %s", a.Loaded, o.cfg.CacheFile)
	}
	return nil
}

// stop lets go of the state; the last holder stops its background work and
// saves the cache file.
func (o *OGS) stop() error {
	if o.lease == nil {
		return nil
	}
	if err := o.lease.Release(); err != nil {
		return plugin.Error(pluginName, err)
	}
	return nil
}

// restartFailed undoes a reload that failed after the new configuration took
// its leases: those are released, and this configuration's settings apply
// again.
func (o *OGS) restartFailed() error {
	if o.marked {
		states.ReleaseSince(o.mark)
		o.marked = false
	}
	if o.sel != nil {
		if _, err := o.sel.Reconfigure(o.cfg); err != nil {
			return plugin.Error(pluginName, err)
		}
	}
	return nil
}

// parse reads
//
//	ogs [NAMES...] {
//		gateway NAME ADDRESS:PORT [backup NAME...]
//		probe tcp|tls|http|https [PATH]
//		probe_verify_tls
//		probes COUNT
//		deadline DURATION
//		probe_timeout DURATION
//		answer_deadline DURATION
//		cache_ttl DURATION
//		retry DURATION
//		ttl SECONDS
//		fallback_ttl SECONDS
//		records COUNT
//		unmeasured last|omit
//		prefix V4LEN V6LEN
//		location resolv_conf [PATH]
//		srv
//		cache_file PATH
//		state NAME
//		recheck DURATION|off
//		soa MNAME RNAME [MINIMUM]
//		ns NAME [ADDRESS...]
//		max_locations COUNT
//		diagnostic NAME
//		fallthrough [ZONES...]
//	}
func parse(c *caddy.Controller) (*OGS, error) {
	o := &OGS{ttl: 30, fallbackTTL: 5, v4Prefix: 24, v6Prefix: 56, state: strings.Join(c.ServerBlockKeys, " ")}
	cfg := ogs.Config{}
	probe, path, verify := "https", "/", false
	minimum := int64(-1) // SOA MINIMUM: default the answers' TTL
	seen := false
	for c.Next() {
		if seen {
			return nil, c.Err("ogs: only one ogs block per server block")
		}
		seen = true
		o.names = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)
		for c.NextBlock() {
			opt := c.Val()
			args := c.RemainingArgs()
			bad := func(format string, a ...any) error {
				return c.Errf("ogs: %s %s: %s", opt, strings.Join(args, " "), fmt.Sprintf(format, a...))
			}
			switch opt {
			case "gateway":
				if len(args) < 2 || (len(args) > 2 && (args[2] != "backup" || len(args) == 3)) {
					return nil, bad("want gateway NAME ADDRESS:PORT [backup NAME...]")
				}
				host, port, err := net.SplitHostPort(args[1])
				if err != nil {
					return nil, bad("%v", err)
				}
				ip := net.ParseIP(host)
				if ip == nil {
					return nil, bad("the address must be an IP: answers carry it")
				}
				if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
					return nil, bad("bad port %q", port)
				}
				g := ogs.Gateway{Name: args[0], Addr: args[1], IP: ip}
				o.hasV4 = o.hasV4 || ip.To4() != nil
				o.hasV6 = o.hasV6 || ip.To4() == nil
				if len(args) > 3 {
					g.Backups = args[3:]
				}
				cfg.Gateways = append(cfg.Gateways, g)
			case "probe":
				if len(args) < 1 || len(args) > 2 {
					return nil, bad("want probe tcp|tls|http|https [PATH]")
				}
				probe = args[0]
				if len(args) == 2 {
					path = args[1]
				}
				switch probe {
				case "tcp", "tls", "http", "https":
				default:
					return nil, bad("unknown probe kind %q; want tcp, tls, http or https", probe)
				}
			case "probe_verify_tls":
				if len(args) != 0 {
					return nil, bad("takes no argument")
				}
				verify = true
			case "fallback_ttl":
				if len(args) != 1 {
					return nil, bad("want seconds")
				}
				n, err := strconv.ParseUint(args[0], 10, 31)
				if err != nil {
					return nil, bad("want a whole number of seconds")
				}
				o.fallbackTTL = uint32(n)
			case "probes", "records", "max_locations", "ttl":
				if len(args) != 1 {
					return nil, bad("want one number")
				}
				n, err := strconv.Atoi(args[0])
				if err != nil || n < 1 {
					return nil, bad("want a whole number of at least 1")
				}
				switch opt {
				case "probes":
					cfg.Probes = n
				case "records":
					o.records = n
				case "max_locations":
					cfg.MaxLocations = n
				case "ttl":
					o.ttl = uint32(n)
				}
			case "deadline", "probe_timeout", "answer_deadline", "cache_ttl", "retry":
				if len(args) != 1 {
					return nil, bad("want one duration")
				}
				d, err := parseDuration(args[0])
				if err != nil || d <= 0 {
					return nil, bad("want a positive duration such as 7s, 10m or 14d")
				}
				switch opt {
				case "deadline":
					cfg.Deadline = d
				case "probe_timeout":
					cfg.ProbeTimeout = d
				case "answer_deadline":
					cfg.AnswerDeadline = d
				case "cache_ttl":
					cfg.CacheTTL = d
				case "retry":
					cfg.Retry = d
				}
			case "unmeasured":
				if len(args) != 1 || (args[0] != "last" && args[0] != "omit") {
					return nil, bad("want last or omit")
				}
				cfg.OmitUnmeasured = args[0] == "omit"
			case "prefix":
				if len(args) != 2 {
					return nil, bad("want prefix V4LEN V6LEN")
				}
				v4, err4 := strconv.Atoi(args[0])
				v6, err6 := strconv.Atoi(args[1])
				if err4 != nil || err6 != nil || v4 < 0 || v4 > 32 || v6 < 0 || v6 > 128 {
					return nil, bad("want 0-32 and 0-128")
				}
				o.v4Prefix, o.v6Prefix = v4, v6
			case "location":
				if len(args) < 1 || len(args) > 2 || args[0] != "resolv_conf" {
					return nil, bad("want location resolv_conf [PATH]")
				}
				path := "/etc/resolv.conf"
				if len(args) == 2 {
					path = args[1]
				}
				o.resolv = &ogs.ResolvConf{Path: path}
				o.networks = ogs.NewNetworks(10_000)
			case "srv":
				if len(args) != 0 {
					return nil, bad("takes no argument")
				}
				o.srv = true
			case "cache_file":
				if len(args) != 1 {
					return nil, bad("want one path")
				}
				cfg.CacheFile = args[0]
			case "recheck":
				if len(args) != 1 {
					return nil, bad("want a duration or off")
				}
				if args[0] == "off" {
					cfg.Recheck = -1
					break
				}
				d, err := parseDuration(args[0])
				if err != nil || d <= 0 {
					return nil, bad("want a positive duration such as 1m, or off")
				}
				cfg.Recheck = d
			case "soa":
				if len(args) < 2 || len(args) > 3 {
					return nil, bad("want soa MNAME RNAME [MINIMUM]")
				}
				o.soa.mname, o.soa.rname = dns.Fqdn(strings.ToLower(args[0])), dns.Fqdn(strings.ToLower(args[1]))
				if len(args) == 3 {
					n, err := strconv.ParseUint(args[2], 10, 32)
					if err != nil {
						return nil, bad("MINIMUM: want seconds")
					}
					minimum = int64(n)
				}
			case "ns":
				if len(args) < 1 {
					return nil, bad("want ns NAME [ADDRESS...]")
				}
				ns := nsConfig{name: dns.Fqdn(strings.ToLower(args[0]))}
				if _, ok := dns.IsDomainName(ns.name); !ok {
					return nil, bad("%q is not a domain name", args[0])
				}
				for _, a := range args[1:] {
					ip := net.ParseIP(a)
					if ip == nil {
						return nil, bad("%q is not an IP address", a)
					}
					ns.addrs = append(ns.addrs, ip)
				}
				o.ns = append(o.ns, ns)
			case "state":
				if len(args) != 1 {
					return nil, bad("want one name")
				}
				o.state = args[0]
			case "diagnostic":
				if len(args) != 1 {
					return nil, bad("want one name")
				}
				o.diagnostic = dns.Fqdn(strings.ToLower(args[0]))
			case "fallthrough":
				o.Fall.SetZonesFromArgs(args)
			default:
				return nil, c.Errf("ogs: unknown option %q", opt)
			}
		}
	}
	if len(cfg.Gateways) == 0 {
		return nil, c.Err("ogs: at least one gateway is required")
	}
	tlsCfg := &tls.Config{InsecureSkipVerify: !verify} //nolint:gosec // latency probe; opt in to verification
	switch probe {
	case "tcp":
		cfg.Prober = latency.TCPProber{}
	case "tls":
		cfg.Prober = latency.TLSProber{Config: tlsCfg}
	default:
		// Like the seed: each probe its own connection, timed from the SYN
		// to the end of the exchange.
		cfg.Prober = latency.NewHTTPProber(probe, path, "", tlsCfg, true)
	}
	if cfg.ProbeTimeout == 0 && probe != "tcp" {
		// A TLS handshake or an HTTPS exchange takes several round trips;
		// a connect takes one (ogs.DefaultProbeTimeout).
		cfg.ProbeTimeout = exchangeProbeTimeout
	}
	cfg.ProbeID = fmt.Sprintf("%s %s verify=%t", probe, path, verify)
	if probe == "tcp" || probe == "tls" {
		cfg.ProbeID = fmt.Sprintf("%s verify=%t", probe, verify)
	}
	cfg.OnRun = o.logRun
	cfg.OnRecheck = o.logRecheck
	cfg.OnError = func(err error) { log.Error(err) }
	if err := cfg.Validate(); err != nil {
		return nil, c.Errf("ogs: %v", err)
	}
	cfg.FillDefaults()
	o.cfg = cfg
	o.soa.minimum = o.ttl
	if minimum >= 0 {
		o.soa.minimum = uint32(minimum)
	}
	// The serial changes with every configuration loaded (RFC 1982
	// arithmetic wraps it), so a secondary sees a reload as a new version.
	o.soa.serial = uint32(time.Now().Unix())
	if o.diagnostic == "" {
		o.diagnostic = "_ogs." + o.names[0]
	}
	return o, nil
}

// parseDuration is time.ParseDuration plus whole days ("14d").
func parseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, err
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}
