package ogs

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
	"github.com/edgesteer/edgesteer/internal/ogs"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

const pluginName = "ogs"

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
	if o.redis != nil {
		client, release, err := redisconn.Acquire("ogs", o.redis)
		if err != nil {
			return plugin.Error(pluginName, fmt.Errorf("store redis: %v", err))
		}
		o.store.client, o.store.release = client, release
	}
	a, err := states.Acquire(o.state, o.cfg)
	if err != nil {
		o.releaseClient()
		return plugin.Error(pluginName, err)
	}
	o.lease, o.sel = a.Lease, a.Selector()
	if o.admin != "" {
		if err := adminAcquire(o); err != nil {
			o.lease.Release()
			o.lease = nil
			o.releaseClient()
			return plugin.Error(pluginName, err)
		}
	}
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

func (o *OGS) releaseClient() {
	if o.store != nil && o.store.release != nil {
		o.store.release()
	}
}

// stop lets go of the state; the last holder stops its background work and
// saves the cache file.
func (o *OGS) stop() error {
	adminRelease(o)
	if o.lease == nil {
		return nil
	}
	err := o.lease.Release()
	o.releaseClient()
	if err != nil {
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
	adminRestore(o)
	if o.sel != nil {
		if _, err := o.sel.Reconfigure(o.cfg); err != nil {
			return plugin.Error(pluginName, err)
		}
	}
	return nil
}

// options are the options of an ogs block: each one's syntax (the error for
// a wrong number of arguments quotes it), its least and most arguments
// (many: no limit), and whether it may repeat; one that may not is given
// at most once. The README says the same.
var options = map[string]struct {
	syntax   string
	min, max int
	repeat   bool
}{
	"gateway":          {"gateway NAME ADDRESS:PORT [backup NAME...]", 2, many, true},
	"probe":            {"probe tcp|tls|http|https [PATH]", 1, 2, false},
	"probe_verify_tls": {"probe_verify_tls", 0, 0, false},
	"probes":           {"probes COUNT", 1, 1, false},
	"deadline":         {"deadline DURATION", 1, 1, false},
	"probe_timeout":    {"probe_timeout DURATION", 1, 1, false},
	"answer_deadline":  {"answer_deadline DURATION", 1, 1, false},
	"cache_ttl":        {"cache_ttl DURATION", 1, 1, false},
	"retry":            {"retry DURATION", 1, 1, false},
	"ttl":              {"ttl SECONDS", 1, 1, false},
	"fallback_ttl":     {"fallback_ttl SECONDS", 1, 1, false},
	"records":          {"records COUNT", 1, 1, false},
	"unmeasured":       {"unmeasured last|omit", 1, 1, false},
	"prefix":           {"prefix V4LEN V6LEN", 2, 2, false},
	"location":         {"location resolv_conf [PATH]", 1, 2, false},
	"srv":              {"srv", 0, 0, false},
	"cache_file":       {"cache_file PATH", 1, 1, false},
	"state":            {"state NAME", 1, 1, false},
	"recheck":          {"recheck DURATION|off", 1, 1, false},
	"soa":              {"soa MNAME RNAME [MINIMUM]", 2, 3, false},
	"ns":               {"ns NAME [ADDRESS...]", 1, many, true},
	"max_locations":    {"max_locations COUNT", 1, 1, false},
	"diagnostic":       {"diagnostic NAME", 1, 1, false},
	"store":            {"store redis { OPTIONS }", 1, 1, false},
	"admin":            {"admin HOST:PORT", 1, 1, false},
	"fallthrough":      {"fallthrough [ZONES...]", 0, many, false},

	"report_tokens":        {"report_tokens FILE", 1, 1, false},
	"report_window":        {"report_window DURATION", 1, 1, false},
	"min_reporters":        {"min_reporters COUNT", 1, 1, false},
	"max_reporters":        {"max_reporters COUNT", 1, 1, false},
	"max_report_locations": {"max_report_locations COUNT", 1, 1, false},
	"report_rate":          {"report_rate PER_SECOND [BURST]", 1, 2, false},
	"report_max_body":      {"report_max_body BYTES", 1, 1, false},
	"trusted_proxies":      {"trusted_proxies CIDR...", 1, many, false},
}

const many = -1

// maxTTL is the largest TTL (RFC 2181 §8: a TTL with its top bit set reads
// as zero).
const maxTTL = math.MaxInt32

// parse reads an ogs block (syntax in options and the README) strictly:
// an unknown option, a wrong number of arguments, a block after an option,
// a second occurrence of an option that is not repeatable, or a value that
// is not exactly a decimal number, a duration or a listed word fails at the
// file and line, naming the option and the value.
func parse(c *caddy.Controller) (*OGS, error) {
	o := &OGS{ttl: 30, fallbackTTL: 5, v4Prefix: 24, v6Prefix: 56, state: strings.Join(c.ServerBlockKeys, " ")}
	cfg := ogs.Config{}
	probe, path, verify := "https", "/", false
	minimum := int64(-1) // SOA MINIMUM: default the answers' TTL
	seen := false
	given := map[string]string{} // option → "file:line" of its first occurrence
	rc := &reportConfig{maxBody: defaultReportMaxBody, rate: defaultReportRate, burst: defaultReportBurst}
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
				return c.Errf("ogs: %s: %s", strings.TrimSpace(opt+" "+strings.Join(args, " ")), fmt.Sprintf(format, a...))
			}
			spec, ok := options[opt]
			switch {
			case !ok:
				return nil, c.Errf("ogs: unknown option %q", opt)
			case opt != "store" && c.NextArg(): // RemainingArgs stopped at a '{' on the option's line
				return nil, bad("takes no block")
			case len(args) < spec.min || (spec.max != many && len(args) > spec.max):
				return nil, bad("want %s", spec.syntax)
			}
			if first, ok := given[opt]; ok && !spec.repeat {
				return nil, c.Errf("ogs: %s given twice (first at %s)", opt, first)
			}
			given[opt] = fmt.Sprintf("%s:%d", c.File(), c.Line())
			// intArg and durationArg read a whole number or a positive
			// duration; the error names the option and the value (and, of
			// an option with several, which one).
			intArg := func(what, s string, min, max int) (int, error) {
				n, err := cfvalue.Int(s, min, max)
				if err != nil {
					return 0, bad("%s%v", what, err)
				}
				return n, nil
			}
			durationArg := func(s string) (time.Duration, error) {
				d, err := cfvalue.Duration(s, time.Nanosecond)
				if err != nil {
					return 0, bad("%v", err)
				}
				return d, nil
			}
			var err error
			switch opt {
			case "gateway":
				if len(args) > 2 && (args[2] != "backup" || len(args) == 3) {
					return nil, bad("want %s", spec.syntax)
				}
				host, port, err := net.SplitHostPort(args[1])
				if err != nil {
					return nil, bad("%v", err)
				}
				ip := net.ParseIP(host)
				if ip == nil {
					return nil, bad("the address must be an IP: answers carry it")
				}
				if _, err := cfvalue.Int(port, 1, 65535); err != nil {
					return nil, bad("bad port %q: %v", port, err)
				}
				g := ogs.Gateway{Name: args[0], Addr: args[1], IP: ip}
				o.hasV4 = o.hasV4 || ip.To4() != nil
				o.hasV6 = o.hasV6 || ip.To4() == nil
				if len(args) > 3 {
					g.Backups = args[3:]
				}
				cfg.Gateways = append(cfg.Gateways, g)
			case "probe":
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
				verify = true
			case "fallback_ttl":
				var n int
				n, err = intArg("", args[0], 0, maxTTL)
				o.fallbackTTL = uint32(n)
			case "ttl":
				var n int
				n, err = intArg("", args[0], 1, maxTTL)
				o.ttl = uint32(n)
			case "probes":
				cfg.Probes, err = intArg("", args[0], 1, math.MaxInt)
			case "records":
				o.records, err = intArg("", args[0], 1, math.MaxInt)
			case "max_locations":
				cfg.MaxLocations, err = intArg("", args[0], 1, math.MaxInt)
			case "deadline":
				cfg.Deadline, err = durationArg(args[0])
			case "probe_timeout":
				cfg.ProbeTimeout, err = durationArg(args[0])
			case "answer_deadline":
				cfg.AnswerDeadline, err = durationArg(args[0])
			case "cache_ttl":
				cfg.CacheTTL, err = durationArg(args[0])
			case "retry":
				cfg.Retry, err = durationArg(args[0])
			case "unmeasured":
				if args[0] != "last" && args[0] != "omit" {
					return nil, bad("want last or omit")
				}
				cfg.OmitUnmeasured = args[0] == "omit"
			case "prefix":
				if o.v4Prefix, err = intArg("V4LEN: ", args[0], 0, 32); err == nil {
					o.v6Prefix, err = intArg("V6LEN: ", args[1], 0, 128)
				}
			case "location":
				if args[0] != "resolv_conf" {
					return nil, bad("want %s", spec.syntax)
				}
				path := "/etc/resolv.conf"
				if len(args) == 2 {
					path = args[1]
				}
				o.resolv = &ogs.ResolvConf{Path: path}
				o.networks = ogs.NewNetworks(10_000)
			case "srv":
				o.srv = true
			case "cache_file":
				cfg.CacheFile = args[0]
			case "recheck":
				if args[0] == "off" {
					cfg.Recheck = -1
					break
				}
				cfg.Recheck, err = durationArg(args[0])
			case "soa":
				o.soa.mname, o.soa.rname = dns.Fqdn(strings.ToLower(args[0])), dns.Fqdn(strings.ToLower(args[1]))
				if len(args) == 3 {
					var n int
					n, err = intArg("MINIMUM: ", args[2], 0, maxTTL)
					minimum = int64(n)
				}
			case "ns":
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
				o.state = args[0]
			case "diagnostic":
				o.diagnostic = dns.Fqdn(strings.ToLower(args[0]))
			case "store":
				if args[0] != "redis" {
					return nil, bad("unknown store %q; want redis (the local cache, with cache_file, is the default)", args[0])
				}
				o.redis, err = parseRedis(c)
			case "admin":
				o.admin, err = adminAddr(args[0])
				if err != nil {
					err = bad("%v", err)
				}
			case "fallthrough":
				o.Fall.SetZonesFromArgs(args)
			case "report_tokens":
				// A file named in the configuration must be there at load,
				// as Caddy's and CoreDNS's own file options must (tls,
				// hosts): a typo would otherwise refuse every report.
				if rc.tokens, err = ogs.LoadTokens(args[0]); err != nil {
					err = bad("%v", err)
				} else if terr := rc.tokens.Err(); terr != nil {
					err = bad("%v", terr)
				}
			case "report_window":
				cfg.Reports.Window, err = durationArg(args[0])
				if err == nil && cfg.Reports.Window >= 30*24*time.Hour {
					err = bad("at most 30 days")
				}
			case "min_reporters":
				cfg.Reports.MinReporters, err = intArg("", args[0], 1, 1_000_000)
			case "max_reporters":
				cfg.Reports.MaxReporters, err = intArg("", args[0], 1, 1_000_000)
			case "max_report_locations":
				cfg.Reports.MaxLocations, err = intArg("", args[0], 1, math.MaxInt32)
			case "report_rate":
				var r float64
				if r, err = strconv.ParseFloat(args[0], 64); err != nil || r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
					err = bad("PER_SECOND %q: want a positive number", args[0])
					break
				}
				rc.rate = r
				if len(args) == 2 {
					rc.burst, err = intArg("BURST: ", args[1], 1, 1_000_000)
				}
			case "report_max_body":
				var n int
				n, err = intArg("", args[0], 256, 1<<20)
				rc.maxBody = int64(n)
			case "trusted_proxies":
				for _, a := range args {
					_, n, perr := net.ParseCIDR(a)
					if perr != nil {
						err = bad("%q is not a CIDR prefix", a)
						break
					}
					rc.trusted = append(rc.trusted, n)
				}
			}
			if err != nil {
				return nil, err
			}
		}
	}
	if len(cfg.Gateways) == 0 {
		return nil, c.Err("ogs: at least one gateway is required")
	}
	if rc.tokens == nil {
		for _, opt := range []string{"report_window", "min_reporters", "max_reporters", "max_report_locations", "report_rate", "report_max_body", "trusted_proxies"} {
			if at, ok := given[opt]; ok {
				return nil, c.Errf("ogs: %s (at %s): needs report_tokens FILE (reports are off without it)", opt, at)
			}
		}
	} else {
		if o.admin == "" {
			return nil, c.Errf("ogs: report_tokens %s: needs admin HOST:PORT (the report endpoint, POST /ogs/reports, listens there)", rc.tokens.Path)
		}
		cfg.Reports.Enabled = true
		cfg.Reports.Probe = probe
		rc.byToken = ogs.NewReportLimiter(rc.rate, rc.burst, ogs.MaxTokens)
		rc.bySource = ogs.NewReportLimiter(rc.rate, rc.burst, reportSources)
		o.reports = rc
	}
	// The same prober as the reporter's (builds/ogs-report).
	prober, probeTimeout, err := ogs.NewProber(probe, path, verify)
	if err != nil {
		return nil, c.Errf("ogs: %v", err)
	}
	cfg.Prober = prober
	if cfg.ProbeTimeout == 0 {
		// A TLS handshake or an HTTPS exchange takes several round trips;
		// a connect takes one.
		cfg.ProbeTimeout = probeTimeout
	}
	cfg.ProbeID = fmt.Sprintf("%s %s verify=%t", probe, path, verify)
	if probe == "tcp" || probe == "tls" {
		cfg.ProbeID = fmt.Sprintf("%s verify=%t", probe, verify)
	}
	if o.redis != nil && given["state"] == "" {
		// Replicas started with other ports share results when they serve
		// the same names: the default state name holds the port.
		o.storeName = strings.Join(o.names, ",")
	} else {
		o.storeName = o.state
	}
	if o.redis != nil {
		o.store = &redisStore{ns: o.redis.Key(pluginName, o.storeName) + ":"}
		cfg.Store = o.store
		cfg.StoreTimeout = time.Duration(max(o.redis.ReadTimeout, o.redis.WriteTimeout))
		cfg.OnStore = o.onStore
		if cfg.Reports.Enabled {
			cfg.ReportStore = o.store
		}
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

// parseRedis reads the block of `store redis` through redisconn's Set, so
// each option is spelled and checked as in the Caddy app edgesteer_redis;
// the cursor is after `redis`.
func parseRedis(c *caddy.Controller) (*redisconn.Config, error) {
	cfg := &redisconn.Config{}
	given := map[string]string{}
	for c.NextBlock() {
		opt, args := c.Val(), c.RemainingArgs()
		bad := func(format string, a ...any) error {
			return c.Errf("ogs: store redis: %s: %s", strings.TrimSpace(opt+" "+strings.Join(args, " ")), fmt.Sprintf(format, a...))
		}
		if c.NextArg() {
			return nil, bad("takes no block")
		}
		if first, ok := given[opt]; ok && opt != "address" {
			return nil, c.Errf("ogs: store redis: %s given twice (first at %s)", opt, first)
		}
		given[opt] = fmt.Sprintf("%s:%d", c.File(), c.Line())
		if err := cfg.Set(opt, args); err != nil {
			if errors.Is(err, redisconn.ErrUnknown) {
				return nil, c.Errf("ogs: store redis: unknown option %q (want one of %s)", opt, strings.Join(redisconn.Options, ", "))
			}
			return nil, bad("%v", err)
		}
	}
	cfg.FillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, c.Errf("ogs: store redis: %v", err)
	}
	if _, err := cfg.Universal(); err != nil { // reads the TLS files now, not at the first query
		return nil, c.Errf("ogs: store redis: %v", err)
	}
	return cfg, nil
}

// adminAddr checks the admin option's HOST:PORT: an IP or a name (or empty,
// every address) and a port 1-65535.
func adminAddr(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("want HOST:PORT: %v", err)
	}
	if _, err := cfvalue.Int(port, 1, 65535); err != nil {
		return "", fmt.Errorf("bad port %q: %v", port, err)
	}
	if host != "" && net.ParseIP(host) == nil {
		if _, ok := dns.IsDomainName(host); !ok || strings.ContainsAny(host, "/ ") {
			return "", fmt.Errorf("bad host %q", host)
		}
	}
	return s, nil
}
