// Package gatewayorder is the order rule of Optimal Gateway Selection as
// Cisco AnyConnect has it: from each gateway's lowest RTT, the optimal
// gateway first, then its backups that answered, then the rest by RTT (see
// Order), and the Result that carries such an order. Probe runs
// (internal/gatewaysel) and client reports (internal/rttreports) both order
// gateways by it.
package gatewayorder

import (
	"net"
	"slices"
	"time"
)

// Gateway is one selectable gateway.
type Gateway struct {
	Name    string   // e.g. "gw1.example.test"
	Addr    string   // host:port probed, e.g. "192.0.2.10:443"
	Backups []string // names of other gateways, or of Unprobed, tried after this one
	IP      net.IP   // the address answers carry (Addr's host); optional
	// Unprobed are backups that are not gateways (AnyConnect probes only
	// the primary servers; a backup server is a name): never probed,
	// answered only after this gateway when it is first (see Targets).
	Unprobed []Gateway
}

// Names returns the gateways' names in r's order.
func (r *Result) Names() []string {
	out := make([]string, len(r.Order))
	for i, j := range r.Order {
		out[i] = r.Gateways[j].Name
	}
	return out
}

// Targets is res's order as answers give it: the gateways of res.Order,
// with the first one's unprobed backups inserted after it where its backup
// list names them, so that its backups come exactly as listed (a probed
// backup that did not answer is not among them: it comes later, by Order).
func Targets(res *Result) []Gateway {
	if len(res.Order) == 0 {
		return nil
	}
	first := res.Gateways[res.Order[0]]
	out := make([]Gateway, 0, len(res.Order)+len(first.Unprobed))
	out = append(out, first)
	k := 1
	for _, b := range first.Backups {
		if u := slices.IndexFunc(first.Unprobed, func(g Gateway) bool { return g.Name == b }); u >= 0 {
			out = append(out, first.Unprobed[u])
		} else if k < len(res.Order) && res.Gateways[res.Order[k]].Name == b {
			out = append(out, res.Gateways[res.Order[k]])
			k++
		}
	}
	for _, i := range res.Order[k:] {
		out = append(out, res.Gateways[i])
	}
	return out
}

// Order returns gateway indices in selection order for the RTTs measured
// (rtts[i] <= 0: no successful probe). One rule: the optimal gateway (lowest
// RTT, ties by config order) first, then those of its backups that answered,
// in backup-list order, then the other gateways that answered, by RTT, then
// the gateways that did not answer (backups included), in config order, or
// none of them when omitUnmeasured. With no gateway answered at all it
// returns the configured order, all of them.
func Order(gws []Gateway, rtts []time.Duration, omitUnmeasured bool) []int {
	byName := make(map[string]int, len(gws))
	for i, g := range gws {
		byName[g.Name] = i
	}
	measured := make([]int, 0, len(gws))
	for i := range gws {
		if rtts[i] > 0 {
			measured = append(measured, i)
		}
	}
	if len(measured) == 0 {
		out := make([]int, len(gws))
		for i := range out {
			out[i] = i
		}
		return out
	}
	slices.SortStableFunc(measured, func(a, b int) int {
		switch {
		case rtts[a] < rtts[b]:
			return -1
		case rtts[a] > rtts[b]:
			return 1
		}
		return 0
	})
	out := make([]int, 0, len(gws))
	seen := make([]bool, len(gws))
	add := func(i int) {
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	best := measured[0]
	add(best)
	for _, b := range gws[best].Backups {
		if i, ok := byName[b]; ok && rtts[i] > 0 {
			add(i)
		}
	}
	for _, i := range measured {
		add(i)
	}
	if !omitUnmeasured {
		for i := range gws {
			add(i)
		}
	}
	return out
}

// Result is one location's selection. It is never modified once made, so
// an answer being written may keep using it while a reload replaces it.
type Result struct {
	Gateways []Gateway       // the configuration the indices below refer to
	Order    []int           // gateway indices, best first
	RTTs     []time.Duration // lowest RTT per gateway (0: no successful probe)
	Reasons  []string        // per gateway, why its last failed probe failed ("": none failed); may be nil
	Dead     []string        // per gateway, the re-check's failure reason ("": not found dead); may be nil
	At       time.Time       // when the probe run finished
	// Held and HoldUntil are the location's hold when this result was made
	// (hold.go), kept with it in the store and the cache file.
	Held      string
	HoldUntil time.Time
}
