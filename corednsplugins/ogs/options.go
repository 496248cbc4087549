package ogs

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/miekg/dns"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/gatewaysel"
)

// option is one option of an ogs block: its syntax (the error for a wrong
// number of arguments quotes it), its least and most arguments (many: no
// limit), whether it may repeat (one that may not is given at most once),
// and the parser of its arguments.
type option struct {
	syntax   string
	min, max int
	repeat   bool
	parse    func(*optionLine) error
}

const many = -1

// maxTTL is the largest TTL (RFC 2181 §8: a TTL with its top bit set reads
// as zero).
const maxTTL = math.MaxInt32

// options are the options of an ogs block. The README says the same.
var options = map[string]option{
	"gateway":            {"gateway NAME ADDRESS:PORT [backup NAME|NAME=ADDRESS:PORT...]", 2, many, true, parseGateway},
	"probe":              {"probe tcp|tls|http|https [PATH]", 1, 2, false, parseProbe},
	"probe_verify_tls":   {"probe_verify_tls", 0, 0, false, func(l *optionLine) error { l.verify = true; return nil }},
	"probe_check_status": {"probe_check_status", 0, 0, false, func(l *optionLine) error { l.checkStatus = true; return nil }},
	"probes":             {"probes COUNT", 1, 1, false, countOption(1, math.MaxInt, func(b *block) *int { return &b.cfg.Probes })},
	"deadline":           {"deadline DURATION", 1, 1, false, durationOption(func(b *block) *time.Duration { return &b.cfg.Deadline })},
	"probe_timeout":      {"probe_timeout DURATION", 1, 1, false, durationOption(func(b *block) *time.Duration { return &b.cfg.ProbeTimeout })},
	"answer_deadline":    {"answer_deadline DURATION", 1, 1, false, durationOption(func(b *block) *time.Duration { return &b.cfg.AnswerDeadline })},
	"cache_ttl":          {"cache_ttl DURATION", 1, 1, false, durationOption(func(b *block) *time.Duration { return &b.cfg.CacheTTL })},
	"retry":              {"retry DURATION", 1, 1, false, durationOption(func(b *block) *time.Duration { return &b.cfg.Retry })},
	"ttl":                {"ttl SECONDS", 1, 1, false, ttlOption(1, func(o *OGS) *uint32 { return &o.ttl })},
	"fallback_ttl":       {"fallback_ttl SECONDS", 1, 1, false, ttlOption(0, func(o *OGS) *uint32 { return &o.fallbackTTL })},
	"records":            {"records COUNT", 1, 1, false, countOption(1, math.MaxInt, func(b *block) *int { return &b.o.records })},
	"unmeasured":         {"unmeasured last|omit", 1, 1, false, parseUnmeasured},
	"prefix":             {"prefix V4LEN V6LEN", 2, 2, false, parsePrefix},
	"location":           {"location resolv_conf [PATH]", 1, 2, false, parseLocation},
	"srv":                {"srv", 0, 0, false, func(l *optionLine) error { l.o.srv = true; return nil }},
	"cache_file":         {"cache_file PATH", 1, 1, false, func(l *optionLine) error { l.cfg.CacheFile = l.args[0]; return nil }},
	"state":              {"state NAME", 1, 1, false, func(l *optionLine) error { l.o.state = l.args[0]; return nil }},
	"recheck":            {"recheck DURATION|off", 1, 1, false, parseRecheck},
	"hold":               {"hold DURATION|0", 1, 1, false, parseHold},
	"soa":                {"soa MNAME RNAME [MINIMUM]", 2, 3, false, parseSOA},
	"ns":                 {"ns NAME [ADDRESS...]", 1, many, true, parseNS},
	"max_locations":      {"max_locations COUNT", 1, 1, false, countOption(1, math.MaxInt, func(b *block) *int { return &b.cfg.MaxLocations })},
	"diagnostic":         {"diagnostic NAME", 1, 1, false, parseDiagnostic},
	"store":              {"store redis { OPTIONS }", 1, 1, false, parseStore},
	"admin":              {"admin HOST:PORT", 1, 1, false, parseAdmin},
	"fallthrough":        {"fallthrough [ZONES...]", 0, many, false, func(l *optionLine) error { l.o.Fall.SetZonesFromArgs(l.args); return nil }},

	"report_tokens":        {"report_tokens FILE", 1, 1, false, parseReportTokens},
	"report_window":        {"report_window DURATION", 1, 1, false, parseReportWindow},
	"min_reporters":        {"min_reporters COUNT", 1, 1, false, countOption(1, 1_000_000, func(b *block) *int { return &b.cfg.Reports.MinReporters })},
	"max_reporters":        {"max_reporters COUNT", 1, 1, false, countOption(1, 1_000_000, func(b *block) *int { return &b.cfg.Reports.MaxReporters })},
	"max_report_locations": {"max_report_locations COUNT", 1, 1, false, countOption(1, math.MaxInt32, func(b *block) *int { return &b.cfg.Reports.MaxLocations })},
	"report_rate":          {"report_rate PER_SECOND [BURST]", 1, 2, false, parseReportRate},
	"report_max_body":      {"report_max_body BYTES", 1, 1, false, parseReportMaxBody},
	"trusted_proxies":      {"trusted_proxies CIDR...", 1, many, false, parseTrustedProxies},
	"reports":              {"reports HOST:PORT", 1, 1, false, parseReportsListener},
	"report_source_prefix": {"report_source_prefix V4LEN V6LEN", 2, 2, false, parseReportSourcePrefix},
	"max_reporters_per_token": {"max_reporters_per_token COUNT", 1, 1, false,
		countOption(1, 1_000_000, func(b *block) *int { return &b.cfg.Reports.MaxTokenReporters })},
}

// reportOptions are the options that tune client reports: each needs
// report_tokens.
var reportOptions = []string{"reports", "report_window", "min_reporters", "max_reporters", "max_reporters_per_token", "max_report_locations",
	"report_rate", "report_max_body", "trusted_proxies", "report_source_prefix"}

// optionLine is one option line of an ogs block, as its parser sees it.
type optionLine struct {
	*block
	c      *caddy.Controller
	name   string
	args   []string
	syntax string
}

// bad is the error of a bad option line: it quotes the line.
func (l *optionLine) bad(format string, a ...any) error {
	return l.c.Errf("ogs: %s: %s", strings.TrimSpace(l.name+" "+strings.Join(l.args, " ")), fmt.Sprintf(format, a...))
}

// int reads a whole number from min to max; what, if the option has
// several values, says which one ("V4LEN: ").
func (l *optionLine) int(what, s string, min, max int) (int, error) {
	n, err := cfvalue.Int(s, min, max)
	if err != nil {
		return 0, l.bad("%s%v", what, err)
	}
	return n, nil
}

// duration reads a positive duration.
func (l *optionLine) duration(s string) (time.Duration, error) {
	d, err := cfvalue.Duration(s, time.Nanosecond)
	if err != nil {
		return 0, l.bad("%v", err)
	}
	return d, nil
}

// countOption is the parser of an option whose one value is a whole number from
// min to max, kept in field.
func countOption(min, max int, field func(*block) *int) func(*optionLine) error {
	return func(l *optionLine) (err error) {
		*field(l.block), err = l.int("", l.args[0], min, max)
		return err
	}
}

// durationOption is the parser of an option whose one value is a duration, kept
// in field.
func durationOption(field func(*block) *time.Duration) func(*optionLine) error {
	return func(l *optionLine) (err error) {
		*field(l.block), err = l.duration(l.args[0])
		return err
	}
}

// ttlOption is the parser of an option whose one value is a TTL of at least
// min seconds, kept in field.
func ttlOption(min int, field func(*OGS) *uint32) func(*optionLine) error {
	return func(l *optionLine) error {
		n, err := l.int("", l.args[0], min, maxTTL)
		*field(l.o) = uint32(n)
		return err
	}
}

func parseGateway(l *optionLine) error {
	args := l.args
	if len(args) > 2 && (args[2] != "backup" || len(args) == 3) {
		return l.bad("want %s", l.syntax)
	}
	g, err := l.target(args[0], args[1])
	if err != nil {
		return err
	}
	// A backup is a gateway's NAME, or NAME=ADDRESS:PORT: a backup server
	// that is not probed (ogs.Gateway.Unprobed).
	for _, b := range args[min(3, len(args)):] {
		name, addr, unprobed := strings.Cut(b, "=")
		if unprobed {
			u, err := l.target(name, addr)
			if err != nil {
				return err
			}
			g.Unprobed = append(g.Unprobed, u)
		}
		g.Backups = append(g.Backups, name)
	}
	l.cfg.Gateways = append(l.cfg.Gateways, g)
	return nil
}

// target reads a gateway's or a backup server's NAME and IP:PORT.
func (l *optionLine) target(name, addr string) (gatewayorder.Gateway, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return gatewayorder.Gateway{}, l.bad("%v", err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return gatewayorder.Gateway{}, l.bad("the address %s must be an IP: answers carry it", addr)
	}
	if _, err := cfvalue.Int(port, 1, 65535); err != nil {
		return gatewayorder.Gateway{}, l.bad("bad port %q: %v", port, err)
	}
	l.o.hasV4 = l.o.hasV4 || ip.To4() != nil
	l.o.hasV6 = l.o.hasV6 || ip.To4() == nil
	return gatewayorder.Gateway{Name: name, Addr: addr, IP: ip}, nil
}

func parseProbe(l *optionLine) error {
	l.probe = l.args[0]
	if len(l.args) == 2 {
		l.path = l.args[1]
	}
	switch l.probe {
	case "tcp", "tls", "http", "https":
		return nil
	}
	return l.bad("unknown probe kind %q; want tcp, tls, http or https", l.probe)
}

func parseUnmeasured(l *optionLine) error {
	if l.args[0] != "last" && l.args[0] != "omit" {
		return l.bad("want last or omit")
	}
	l.cfg.OmitUnmeasured = l.args[0] == "omit"
	return nil
}

func parsePrefix(l *optionLine) (err error) {
	if l.o.v4Prefix, err = l.int("V4LEN: ", l.args[0], 0, 32); err != nil {
		return err
	}
	l.o.v6Prefix, err = l.int("V6LEN: ", l.args[1], 0, 128)
	return err
}

func parseLocation(l *optionLine) error {
	if l.args[0] != "resolv_conf" {
		return l.bad("want %s", l.syntax)
	}
	path := "/etc/resolv.conf"
	if len(l.args) == 2 {
		path = l.args[1]
	}
	l.o.resolv = &gatewaysel.ResolvConf{Path: path}
	l.o.networks = gatewaysel.NewNetworks(10_000)
	return nil
}

func parseRecheck(l *optionLine) (err error) {
	if l.args[0] == "off" {
		l.cfg.Recheck = -1
		return nil
	}
	l.cfg.Recheck, err = l.duration(l.args[0])
	return err
}

// parseHold reads the hold of a location's first choice; 0 turns it off.
func parseHold(l *optionLine) (err error) {
	if l.args[0] == "0" {
		l.cfg.Hold = -1
		return nil
	}
	l.cfg.Hold, err = l.duration(l.args[0])
	return err
}

func parseSOA(l *optionLine) error {
	l.o.soa.mname, l.o.soa.rname = dns.Fqdn(strings.ToLower(l.args[0])), dns.Fqdn(strings.ToLower(l.args[1]))
	if len(l.args) < 3 {
		return nil
	}
	n, err := l.int("MINIMUM: ", l.args[2], 0, maxTTL)
	l.minimum = int64(n)
	return err
}

func parseNS(l *optionLine) error {
	ns := nsConfig{name: dns.Fqdn(strings.ToLower(l.args[0]))}
	if _, ok := dns.IsDomainName(ns.name); !ok {
		return l.bad("%q is not a domain name", l.args[0])
	}
	for _, a := range l.args[1:] {
		ip := net.ParseIP(a)
		if ip == nil {
			return l.bad("%q is not an IP address", a)
		}
		ns.addrs = append(ns.addrs, ip)
	}
	l.o.ns = append(l.o.ns, ns)
	return nil
}

func parseDiagnostic(l *optionLine) error {
	l.o.diagnostic = dns.Fqdn(strings.ToLower(l.args[0]))
	return nil
}

func parseStore(l *optionLine) (err error) {
	if l.args[0] != "redis" {
		return l.bad("unknown store %q; want redis (the local cache, with cache_file, is the default)", l.args[0])
	}
	l.o.redis, err = parseRedis(l.c)
	return err
}

func parseAdmin(l *optionLine) (err error) {
	if l.o.admin, err = adminAddr(l.args[0]); err != nil {
		return l.bad("%v", err)
	}
	return nil
}

// parseReportTokens loads the token file now: a file named in the
// configuration must be there at load, as Caddy's and CoreDNS's own file
// options must (tls, hosts); a typo would otherwise refuse every report.
func parseReportTokens(l *optionLine) (err error) {
	if l.rc.tokens, err = LoadTokens(l.args[0]); err != nil {
		return l.bad("%v", err)
	}
	if err := l.rc.tokens.Err(); err != nil {
		return l.bad("%v", err)
	}
	return nil
}

func parseReportWindow(l *optionLine) (err error) {
	if l.cfg.Reports.Window, err = l.duration(l.args[0]); err != nil {
		return err
	}
	if l.cfg.Reports.Window >= 30*24*time.Hour {
		return l.bad("at most 30 days")
	}
	return nil
}

func parseReportRate(l *optionLine) error {
	r, err := strconv.ParseFloat(l.args[0], 64)
	if err != nil || r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return l.bad("PER_SECOND %q: want a positive number", l.args[0])
	}
	l.rc.rate = r
	if len(l.args) == 2 {
		l.rc.burst, err = l.int("BURST: ", l.args[1], 1, 1_000_000)
	}
	return err
}

func parseReportMaxBody(l *optionLine) error {
	n, err := l.int("", l.args[0], 256, 1<<20)
	l.rc.maxBody = int64(n)
	return err
}

func parseTrustedProxies(l *optionLine) error {
	for _, a := range l.args {
		_, n, err := net.ParseCIDR(a)
		if err != nil {
			return l.bad("%q is not a CIDR prefix", a)
		}
		l.rc.trusted = append(l.rc.trusted, n)
	}
	return nil
}

func parseReportsListener(l *optionLine) (err error) {
	if l.rc.listen, err = adminAddr(l.args[0]); err != nil {
		return l.bad("%v", err)
	}
	return nil
}

func parseReportSourcePrefix(l *optionLine) (err error) {
	if l.rc.v4Source, err = l.int("V4LEN: ", l.args[0], 1, 32); err != nil {
		return err
	}
	l.rc.v6Source, err = l.int("V6LEN: ", l.args[1], 1, 128)
	return err
}
