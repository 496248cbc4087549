// Command ogs-report measures the gateways of an ogs-served name from the
// client's own network, with the ogs plugin's probe code and rule (each
// gateway probed 3 times, its lowest RTT kept), and sends one report to the
// plugin's report endpoint (POST /ogs/reports). The server orders the
// gateways for this client's network from the reports of several clients.
//
//	ogs-report -url http://dns.example.net:8053/ogs/reports -token-file ~/.ogs-token \
//	    -gateway gw1.example.net=192.0.2.10:443 -gateway gw2.example.net=198.51.100.7:443
//	ogs-report -url http://dns.example.net:8053/ogs/reports -token-file ~/.ogs-token -name vpn.example.net
//
// Exit codes: 0 report accepted (or printed, with -n); 1 bad flags or
// files; 2 no gateway answered (nothing sent); 3 the server refused the
// report (4xx: its reason is printed); 4 the server could not be reached or
// failed (5xx).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
	"github.com/edgesteer/edgesteer/internal/gatewaysel"
	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/rttreports"
)

const (
	exitOK = iota
	exitUsage
	exitNoGateway
	exitRefused
	exitServer
)

type gatewayFlags []gatewayorder.Gateway

func (g *gatewayFlags) String() string { return fmt.Sprint(*g) }
func (g *gatewayFlags) Set(s string) error {
	name, addr, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=HOST:PORT", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	*g = append(*g, gatewayorder.Gateway{Name: name, Addr: addr})
	return nil
}

func main() { os.Exit(run(os.Args[1:])) }

// flags are the command line's settings.
type flags struct {
	gateways  gatewayFlags
	name      string
	dns       string
	url       string
	tokenFile string
	probe     string
	path      string
	verify    bool
	status    bool
	probes    int
	timeout   time.Duration
	source    string
	dry       bool
}

// parseFlags reads the command line; the flag package prints what is wrong.
func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("ogs-report", flag.ContinueOnError)
	fs.Var(&f.gateways, "gateway", "a gateway as NAME=HOST:PORT, its name as the ogs block's `gateway` option gives it (repeat)")
	fs.StringVar(&f.name, "name", "", "read the gateways from this ogs-served name's SRV records (its block's `srv`), instead of -gateway")
	fs.StringVar(&f.dns, "dns", "", "DNS server (HOST:PORT) for -name's SRV and address lookups (default: the system's resolver)")
	fs.StringVar(&f.url, "url", "", "the report endpoint, http://HOST:PORT/ogs/reports (the ogs block's admin address)")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding this reporter's bearer token (or set OGS_REPORT_TOKEN)")
	fs.StringVar(&f.probe, "probe", "https", "probe kind, as the ogs block's `probe`: tcp, tls, http or https")
	fs.StringVar(&f.path, "path", "/", "path of http and https probes")
	fs.BoolVar(&f.verify, "verify", false, "verify gateways' TLS certificates (as probe_verify_tls)")
	fs.BoolVar(&f.status, "check-status", false, "fail an HTTP answer with status 500 or above (as probe_check_status)")
	fs.IntVar(&f.probes, "probes", gatewaysel.DefaultProbes, "probes per gateway; the lowest RTT counts")
	fs.DurationVar(&f.timeout, "timeout", 0, "one probe's timeout (default: the plugin's for the kind)")
	fs.StringVar(&f.source, "source", "", "local IP address to send the report from")
	fs.BoolVar(&f.dry, "n", false, "dry run: measure and print the report, send nothing")
	return f, fs.Parse(args)
}

// usage prints a bad-flags or bad-files error and returns its exit code.
func usage(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "ogs-report: "+format+"\n", a...)
	return exitUsage
}

func run(args []string) int {
	f, err := parseFlags(args)
	if err != nil {
		return exitUsage
	}
	switch {
	case f.name != "" && len(f.gateways) > 0:
		return usage("-name and -gateway: give one of them")
	case f.name == "" && len(f.gateways) == 0:
		return usage("no -gateway or -name given")
	}
	if f.probes < 1 {
		return usage("-probes %d: must be at least 1", f.probes)
	}
	var token string
	if !f.dry {
		if f.url == "" {
			return usage("no -url given (or -n for a dry run)")
		}
		if token, err = f.token(); err != nil {
			return usage("%v", err)
		}
	}
	prober, def, err := gatewaysel.NewProber(f.probe, f.path, f.verify, f.status)
	if err != nil {
		return usage("-%v", err)
	}
	if f.timeout <= 0 {
		f.timeout = def
	}
	ctx := context.Background()
	if f.name != "" {
		if f.gateways, err = discover(ctx, f.name, f.dns, discoverTimeout); err != nil {
			return usage("%v", err)
		}
	}
	rep := Measure(ctx, f.gateways, prober, f.probe, f.probes, f.timeout, progress())
	body, err := rttreports.EncodeReport(rep)
	if err != nil {
		return usage("%v", err)
	}
	answered := false
	for _, m := range rep.Measurements {
		answered = answered || !m.Failed
	}
	if f.dry {
		fmt.Println(string(body))
		if !answered {
			return exitNoGateway
		}
		return exitOK
	}
	if !answered {
		fmt.Fprintln(os.Stderr, "ogs-report: no gateway answered; nothing sent")
		return exitNoGateway
	}
	return send(ctx, f.url, token, f.source, body)
}

// token is the reporter's bearer token: the token file's, else
// OGS_REPORT_TOKEN's.
func (f *flags) token() (string, error) {
	token := os.Getenv("OGS_REPORT_TOKEN")
	if f.tokenFile != "" {
		data, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("-token-file: %v", err)
		}
		token = strings.TrimSpace(string(data))
	}
	if token == "" {
		return "", errors.New("no token: give -token-file or set OGS_REPORT_TOKEN")
	}
	return token, nil
}

// progress prints each gateway's measurement as it ends, when standard
// error is a terminal (nil otherwise).
func progress() func(gatewayorder.Gateway, latency.Result) {
	if fi, err := os.Stderr.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(g gatewayorder.Gateway, r latency.Result) {
		if r.OK == 0 {
			fmt.Fprintf(os.Stderr, "%s %s: failed (%v)\n", g.Name, g.Addr, r.Err)
			return
		}
		fmt.Fprintf(os.Stderr, "%s %s: %.1f ms (%d of %d probes answered)\n", g.Name, g.Addr, float64(r.Best)/float64(time.Millisecond), r.OK, len(r.RTTs))
	}
}

// send posts the report and returns the exit code for the server's answer.
func send(ctx context.Context, url, token, source string, body []byte) int {
	status, reason, detail, err := SendReport(ctx, url, token, source, body)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "ogs-report: %v\n", err)
		return exitServer
	case status >= 200 && status < 300:
		return exitOK
	case status >= 400 && status < 500:
		fmt.Fprintf(os.Stderr, "ogs-report: refused (%d %s): %s\n", status, reason, detail)
		return exitRefused
	}
	fmt.Fprintf(os.Stderr, "ogs-report: server answered %d %s %s\n", status, reason, detail)
	return exitServer
}
