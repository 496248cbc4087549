package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

// maxDiscovered bounds the gateways taken from one SRV answer: a served
// name lists a handful, and a reporter probes each three times.
const maxDiscovered = 64

// discoverTimeout bounds the SRV lookup and the targets' address lookups.
const discoverTimeout = 10 * time.Second

// discover reads the gateways of an ogs-served name from its SRV records
// (the ogs block's `srv` option: one record a gateway, the target is the
// gateway's name, as reports must name it, and the port its port) and
// resolves each target's address. server is the DNS server to ask
// (host:port); empty: the system's resolver. A target that does not
// resolve is an error: a report must measure the gateways the server
// knows, all of them.
func discover(ctx context.Context, name, server string, timeout time.Duration) ([]gatewayorder.Gateway, error) {
	r := net.DefaultResolver
	if server != "" {
		if _, _, err := net.SplitHostPort(server); err != nil {
			return nil, fmt.Errorf("-dns %q: %v", server, err)
		}
		d := net.Dialer{Timeout: timeout}
		r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, server)
		}}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, srvs, err := r.LookupSRV(ctx, "", "", name)
	if err != nil {
		return nil, fmt.Errorf("SRV of %s: %v", name, err)
	}
	if len(srvs) == 0 {
		return nil, fmt.Errorf("SRV of %s: no records (is `srv` on in its ogs block?)", name)
	}
	if len(srvs) > maxDiscovered {
		return nil, fmt.Errorf("SRV of %s: %d records, more than %d", name, len(srvs), maxDiscovered)
	}
	var gws []gatewayorder.Gateway
	for _, s := range srvs {
		target := strings.TrimSuffix(s.Target, ".")
		addrs, err := r.LookupHost(ctx, target)
		if err != nil || len(addrs) == 0 {
			return nil, fmt.Errorf("gateway %s (SRV of %s): %v", target, name, err)
		}
		gws = append(gws, gatewayorder.Gateway{Name: target, Addr: net.JoinHostPort(addrs[0], strconv.Itoa(int(s.Port)))})
	}
	return gws, nil
}
