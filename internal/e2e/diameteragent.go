package e2e

import (
	"cmp"
	"fmt"
	"strings"
)

// DiameterAgent is a Caddyfile layer4 block whose server at Listen runs a
// diameter_agent named dra as the end-to-end tests write it: origin_host
// Origin (dra.example when empty) in realm operator.example at 127.0.0.1,
// then the lines of Head (vendor_id, application), a peer block for each
// of Peers in that order (realm operator.example, address Addrs[name]),
// then the lines of Body (groups, routes and options). Head and Body are
// written as they stand in the agent's block, five tabs in; a leading
// newline is dropped and a trailing one added where missing.
type DiameterAgent struct {
	Listen, Origin string
	Head           string
	Peers          []string
	Addrs          map[string]string
	Body           string
}

// Layer4 is the block, one tab in as in a Caddyfile's global options,
// ending in a newline.
func (a DiameterAgent) Layer4() string {
	var peers strings.Builder
	for _, name := range a.Peers {
		fmt.Fprintf(&peers, `					peer %s {
						realm operator.example
						address %s
					}
`, name, a.Addrs[name])
	}
	return fmt.Sprintf(`	layer4 {
		%s {
			route {
				diameter_agent dra {
					origin_host %s
					origin_realm operator.example
					host_ip_address 127.0.0.1
%s%s%s				}
			}
		}
	}
`, a.Listen, cmp.Or(a.Origin, "dra.example"), lines(a.Head), peers.String(), lines(a.Body))
}

// lines is s without a leading newline and with a trailing one.
func lines(s string) string {
	s = strings.TrimPrefix(s, "\n")
	if s == "" || strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}
