// Command ogs-report measures the gateways of an ogs-served name from the
// client's own network, with the ogs plugin's probe code and rule (each
// gateway probed 3 times, its lowest RTT kept), and sends one report to the
// plugin's report endpoint (POST /ogs/reports). The server orders the
// gateways for this client's network from the reports of several clients.
//
//	ogs-report -url http://dns.example.net:8053/ogs/reports -token-file ~/.ogs-token \
//	    -gateway gw1.example.net=192.0.2.10:443 -gateway gw2.example.net=198.51.100.7:443
//
// Exit codes: 0 report accepted (or printed, with -n); 1 bad flags or
// files; 2 no gateway answered (nothing sent); 3 the server refused the
// report (4xx: its reason is printed); 4 the server could not be reached or
// failed (5xx).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/latency"
	"github.com/edgesteer/edgesteer/internal/ogs"
)

const (
	exitOK = iota
	exitUsage
	exitNoGateway
	exitRefused
	exitServer
)

type gatewayFlags []ogs.Gateway

func (g *gatewayFlags) String() string { return fmt.Sprint(*g) }
func (g *gatewayFlags) Set(s string) error {
	name, addr, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=HOST:PORT", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	*g = append(*g, ogs.Gateway{Name: name, Addr: addr})
	return nil
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("ogs-report", flag.ContinueOnError)
	var gws gatewayFlags
	fs.Var(&gws, "gateway", "a gateway as NAME=HOST:PORT, its name as the ogs block's `gateway` option gives it (repeat)")
	url := fs.String("url", "", "the report endpoint, http://HOST:PORT/ogs/reports (the ogs block's admin address)")
	tokenFile := fs.String("token-file", "", "file holding this reporter's bearer token (or set OGS_REPORT_TOKEN)")
	probe := fs.String("probe", "https", "probe kind, as the ogs block's `probe`: tcp, tls, http or https")
	path := fs.String("path", "/", "path of http and https probes")
	verify := fs.Bool("verify", false, "verify gateways' TLS certificates (as probe_verify_tls)")
	probes := fs.Int("probes", ogs.DefaultProbes, "probes per gateway; the lowest RTT counts")
	timeout := fs.Duration("timeout", 0, "one probe's timeout (default: the plugin's for the kind)")
	source := fs.String("source", "", "local IP address to send the report from")
	dry := fs.Bool("n", false, "dry run: measure and print the report, send nothing")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "ogs-report: "+format+"\n", a...)
		return exitUsage
	}
	if len(gws) == 0 {
		return fail("no -gateway given")
	}
	if *probes < 1 {
		return fail("-probes %d: must be at least 1", *probes)
	}
	var token string
	if !*dry {
		if *url == "" {
			return fail("no -url given (or -n for a dry run)")
		}
		token = os.Getenv("OGS_REPORT_TOKEN")
		if *tokenFile != "" {
			data, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fail("-token-file: %v", err)
			}
			token = strings.TrimSpace(string(data))
		}
		if token == "" {
			return fail("no token: give -token-file or set OGS_REPORT_TOKEN")
		}
	}
	prober, def, err := ogs.NewProber(*probe, *path, *verify)
	if err != nil {
		return fail("-%v", err)
	}
	if *timeout <= 0 {
		*timeout = def
	}
	tty := false
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		tty = true
	}
	progress := func(g ogs.Gateway, r latency.Result) {
		if !tty {
			return
		}
		if r.OK == 0 {
			fmt.Fprintf(os.Stderr, "%s %s: failed (%v)\n", g.Name, g.Addr, r.Err)
			return
		}
		fmt.Fprintf(os.Stderr, "%s %s: %.1f ms (%d of %d probes answered)\n", g.Name, g.Addr, float64(r.Best)/float64(time.Millisecond), r.OK, len(r.RTTs))
	}
	ctx := context.Background()
	rep := ogs.Measure(ctx, gws, prober, *probe, *probes, *timeout, progress)
	body, err := ogs.EncodeReport(rep)
	if err != nil {
		return fail("%v", err)
	}
	answered := false
	for _, m := range rep.Measurements {
		answered = answered || !m.Failed
	}
	if *dry {
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
	status, reason, detail, err := ogs.SendReport(ctx, *url, token, *source, body)
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
