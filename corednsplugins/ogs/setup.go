package ogs

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

const pluginName = "ogs"

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

// states holds each ogs block's process state (cached locations, probe runs
// in flight, background work) by its state name, so that a reload, which
// starts the new configuration before stopping the old, hands it over.
var states = gatewaysel.NewPool()

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
	o.lease, o.sel = a.Lease, a.Table()
	if err := adminAcquire(o); err != nil {
		o.lease.Release()
		o.lease = nil
		o.releaseClient()
		return plugin.Error(pluginName, err)
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

// block is an ogs block being read: the plugin it configures, and what its
// options gather before parse puts them together.
type block struct {
	o           *OGS
	cfg         gatewaysel.Config
	probe       string // probe kind
	path        string // the path of http and https probes
	verify      bool   // probe_verify_tls
	checkStatus bool   // probe_check_status
	minimum     int64  // SOA MINIMUM; -1: the answers' TTL
	rc          *reportConfig
	given       map[string]string // option → "file:line" of its first occurrence
}

// parse reads an ogs block (syntax in options and the README) strictly:
// an unknown option, a wrong number of arguments, a block after an option,
// a second occurrence of an option that is not repeatable, or a value that
// is not exactly a decimal number, a duration or a listed word fails at the
// file and line, naming the option and the value.
func parse(c *caddy.Controller) (*OGS, error) {
	b := &block{
		o:       &OGS{ttl: 30, fallbackTTL: 5, v4Prefix: 24, v6Prefix: 56, state: strings.Join(c.ServerBlockKeys, " ")},
		probe:   "https",
		path:    "/",
		minimum: -1,
		given:   map[string]string{},
		rc: &reportConfig{maxBody: defaultReportMaxBody, rate: defaultReportRate, burst: defaultReportBurst,
			v4Source: defaultReportV4Source, v6Source: defaultReportV6Source},
	}
	seen := false
	for c.Next() {
		if seen {
			return nil, c.Err("ogs: only one ogs block per server block")
		}
		seen = true
		b.o.names = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)
		for c.NextBlock() {
			if err := b.option(c); err != nil {
				return nil, err
			}
		}
	}
	if len(b.cfg.Gateways) == 0 {
		return nil, c.Err("ogs: at least one gateway is required")
	}
	if err := b.reports(c); err != nil {
		return nil, err
	}
	if err := b.prober(c); err != nil {
		return nil, err
	}
	b.store()
	return b.finish(c)
}

// option reads the option line at the cursor: its name, count of
// arguments and repetition checked against the option table, then its
// arguments by the option's own parser.
func (b *block) option(c *caddy.Controller) error {
	l := &optionLine{block: b, c: c, name: c.Val(), args: c.RemainingArgs()}
	spec, ok := options[l.name]
	switch {
	case !ok:
		return c.Errf("ogs: unknown option %q", l.name)
	case l.name != "store" && c.NextArg(): // RemainingArgs stopped at a '{' on the option's line
		return l.bad("takes no block")
	case len(l.args) < spec.min || (spec.max != many && len(l.args) > spec.max):
		return l.bad("want %s", spec.syntax)
	}
	if first, ok := b.given[l.name]; ok && !spec.repeat {
		return c.Errf("ogs: %s given twice (first at %s)", l.name, first)
	}
	b.given[l.name] = fmt.Sprintf("%s:%d", c.File(), c.Line())
	l.syntax = spec.syntax
	return spec.parse(l)
}

// reports turns client reports on when report_tokens is given (their
// endpoint listens on the reports address, else on the admin one), and
// refuses the options that tune them without it.
func (b *block) reports(c *caddy.Controller) error {
	if b.rc.tokens == nil {
		for _, opt := range reportOptions {
			if at, ok := b.given[opt]; ok {
				return c.Errf("ogs: %s (at %s): needs report_tokens FILE (reports are off without it)", opt, at)
			}
		}
		return nil
	}
	if b.o.admin == "" && b.rc.listen == "" {
		return c.Errf("ogs: report_tokens %s: needs reports HOST:PORT or admin HOST:PORT (where the report endpoint, POST /ogs/reports, listens)", b.rc.tokens.Path)
	}
	if b.rc.listen != "" && b.rc.listen == b.o.admin {
		return c.Errf("ogs: reports %s: the admin address; give reports an address of its own (clients reach it, the admin view must not be)", b.rc.listen)
	}
	b.cfg.Reports.Enabled = true
	b.cfg.Reports.Probe = b.probe
	b.rc.byToken = NewReportLimiter(b.rc.rate, b.rc.burst, MaxTokens)
	b.rc.bySource = NewReportLimiter(b.rc.rate, b.rc.burst, reportSources)
	b.o.reports = b.rc
	return nil
}

// prober sets the probe: the same prober as the reporter's
// (builds/ogs-report).
func (b *block) prober(c *caddy.Controller) error {
	prober, probeTimeout, err := gatewaysel.NewProber(b.probe, b.path, b.verify, b.checkStatus)
	if err != nil {
		return c.Errf("ogs: %v", err)
	}
	b.cfg.Prober = prober
	if b.cfg.ProbeTimeout == 0 {
		// A TLS handshake or an HTTPS exchange takes several round trips;
		// a connect takes one.
		b.cfg.ProbeTimeout = probeTimeout
	}
	b.cfg.ProbeID = fmt.Sprintf("%s %s verify=%t", b.probe, b.path, b.verify)
	if b.probe == "tcp" || b.probe == "tls" {
		b.cfg.ProbeID = fmt.Sprintf("%s verify=%t", b.probe, b.verify)
	} else if b.checkStatus {
		b.cfg.ProbeID += " check_status" // measurements of another rule do not compare
	}
	return nil
}

// store names the results in the shared store and, with store redis,
// puts the store in the configuration.
func (b *block) store() {
	o := b.o
	if o.redis != nil && b.given["state"] == "" {
		// Replicas started with other ports share results when they serve
		// the same names: the default state name holds the port.
		o.storeName = strings.Join(o.names, ",")
	} else {
		o.storeName = o.state
	}
	if o.redis == nil {
		return
	}
	o.store = &redisStore{ns: o.redis.Key(pluginName, o.storeName) + ":"}
	b.cfg.Store = o.store
	b.cfg.StoreTimeout = time.Duration(max(o.redis.ReadTimeout, o.redis.WriteTimeout))
	b.cfg.OnStore = o.onStore
	if b.cfg.Reports.Enabled {
		b.cfg.ReportStore = o.store
	}
}

// finish checks the engine's configuration and fills in what the options
// left to defaults.
func (b *block) finish(c *caddy.Controller) (*OGS, error) {
	o, cfg := b.o, b.cfg
	cfg.OnRun = o.logRun
	cfg.OnProbeStart = func(loc string, g gatewayorder.Gateway) {
		log.Infof("OGS starting thread named %s (%s) for location %s", g.Name, g.Addr, loc)
	}
	cfg.OnRecheck = o.logRecheck
	cfg.OnError = func(err error) { log.Error(err) }
	if err := cfg.Validate(); err != nil {
		return nil, c.Errf("ogs: %v", err)
	}
	cfg.FillDefaults()
	o.cfg = cfg
	o.soa.minimum = o.ttl
	if b.minimum >= 0 {
		o.soa.minimum = uint32(b.minimum)
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
