package portrange

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/edgesteer/edgesteer/internal/srcports"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "tier-routes",
		Usage: "--tier-map <file> --shared-ip <addr> --via <node>=<addr>... [--table-base <n>]",
		Short: "Prints the router configuration that returns replies to lower-tier nodes by port",
		Long: `
In the N-tier topology where every lower-tier node sends to the origins from
one shared source address, the router in front of the origins must send each
reply to the node that owns its destination port. This prints a shell script
for that router (an nftables mark per node range, an ip rule per mark and a
route to the node in that rule's table), made from the same tier map file the
nodes load, so the map stays the one source of truth. Running it again
replaces what it installed.

--via gives, for every node of the map, the address the router reaches it at.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("tier-map", "", "The tier map JSON file (required)")
			cmd.Flags().String("shared-ip", "", "The lower tier's shared source address (required)")
			cmd.Flags().StringSlice("via", nil, "node=address, once per node of the map")
			cmd.Flags().Int("table-base", srcports.DefaultTableBase, "Node i uses routing table and mark base+1+i")
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdTierRoutes)
		},
	})
}

func cmdTierRoutes(fl caddycmd.Flags) (int, error) {
	path := fl.String("tier-map")
	if path == "" {
		return caddy1(fmt.Errorf("--tier-map is required"))
	}
	m, err := srcports.Load(path)
	if err != nil {
		return caddy1(err)
	}
	shared, err := netip.ParseAddr(fl.String("shared-ip"))
	if err != nil {
		return caddy1(fmt.Errorf("--shared-ip %q: not an address", fl.String("shared-ip")))
	}
	vias, err := fl.GetStringSlice("via")
	if err != nil {
		return caddy1(err)
	}
	gateways := map[string]netip.Addr{}
	for _, v := range vias {
		name, addr, ok := strings.Cut(v, "=")
		ip, err := netip.ParseAddr(addr)
		if !ok || err != nil {
			return caddy1(fmt.Errorf("--via %q: want node=address", v))
		}
		if _, dup := gateways[name]; dup {
			return caddy1(fmt.Errorf("--via: node %q given twice", name))
		}
		gateways[name] = ip
	}
	script, err := srcports.RouterScript(m, shared, gateways, fl.Int("table-base"))
	if err != nil {
		return caddy1(err)
	}
	if _, err := os.Stdout.WriteString(script); err != nil {
		return caddy1(err)
	}
	return 0, nil
}

// caddy1 is a failed command: exit status 1 with err, as Caddy's own
// commands report bad flags.
func caddy1(err error) (int, error) { return 1, fmt.Errorf("tier-routes: %w", err) }
