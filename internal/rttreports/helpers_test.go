package rttreports

import (
	"time"

	"github.com/edgesteer/edgesteer/internal/gatewayorder"
)

const ms = time.Millisecond

// exampleGateways are the worked example's four gateways (gatewaysel's
// tests measure them at gw1 302, gw2 132, gw3 506 and gw4 877 ms).
func exampleGateways() []gatewayorder.Gateway {
	return []gatewayorder.Gateway{{Name: "gw1", Addr: "a:1"}, {Name: "gw2", Addr: "b:1"}, {Name: "gw3", Addr: "c:1"}, {Name: "gw4", Addr: "d:1"}}
}
